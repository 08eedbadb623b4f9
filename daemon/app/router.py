"""The control router: what a request on the daemon's socket may do, and doing it.

Every request is validated against its op's model (:mod:`b300.app.requests`)
before anything else. A changing request is executed only

- by the active daemon (a standby or a fenced one refuses, naming the active one),
- for root, the daemon's own user or the admin group (the kernel says who asks),
- while its ``deadline`` has not passed and its client is still connected,
  checked again under the action lock right before acting,
- after the lease is proven for it (the fence), so an intent written by a fenced
  daemon can never be carried out by the next active one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from ..checkpoints.access import checkpoint_dir_problem
from ..checkpoints.upkeep import CheckpointUpkeep
from ..config import Config
from ..control.client import refusal
from ..control.server import Peer, is_admin
from ..control.status_view import status_view
from ..cycle.node_actions import NodeActions
from ..cycle.run_actions import RunActions
from ..drift.scheduled import DriftWatch
from ..drill.runner import DrillWatch
from ..errors import B300Error, NotFoundError, UsageError
from ..ha.fence import Fence
from ..ha.lease import FencedError
from ..interfaces import SlurmClient, Store
from ..model import Run, attempt_to_dict, run_to_dict
from ..spec import parse_spec
from ..triage.slurm import node_triage_request
from . import requests as rq

log = structlog.get_logger(__name__)
Clock = Callable[[], Any]


class ControlRouter:
    """Answers control requests for the daemon (:meth:`handle` is the socket's handler)."""

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        store: Store,
        slurm: SlurmClient,
        actions: RunActions,
        drift: DriftWatch | None,
        upkeep: CheckpointUpkeep,
        fence: Fence,
        lock: threading.Lock,
        clock: Clock,
        role: Callable[[], str],
        ping: Callable[[], dict[str, Any]],
        active_holder: Callable[[], str],
        wake: Callable[[], None],
        drills: DrillWatch | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._slurm = slurm
        self._actions = actions
        self._drift = drift
        self._upkeep = upkeep
        self._fence = fence
        self._lock = lock
        self._clock = clock
        self._role = role
        self._ping = ping
        self._active_holder = active_holder
        self._wake = wake
        self._drill_watch = drills

    def handle(self, raw: dict[str, Any], peer: Peer,
               client_alive: Callable[[], bool] | None = None) -> dict[str, Any]:
        """One request in, one reply out (``ok``, and ``result`` or ``error`` + ``exit_code``)."""
        op = str(raw.get("op", ""))[:64]
        try:
            request = rq.parse_request(raw)
            if isinstance(request, rq.Ping):
                return {"ok": True, "result": self._ping()}
            if isinstance(request, rq.Status):
                return {"ok": True, "result": self._status(request)}
            if isinstance(request, rq.DrillStatus):
                return {"ok": True, "result": self._drills().status(request.drill)}
            actor = peer.user
            with structlog.contextvars.bound_contextvars(op=op, user=actor):
                return self._change(request, peer, actor, client_alive)
        except B300Error as exc:
            return {"ok": False, "error": str(exc), "exit_code": exc.exit_code}
        except Exception as exc:
            log.exception("control.crashed", op=op)
            return {"ok": False, "error": f"internal error: {type(exc).__name__}", "exit_code": 1}

    # -- the checks every change passes -------------------------------------

    def _change(self, request: rq._Request, peer: Peer, actor: str,
                client_alive: Callable[[], bool] | None) -> dict[str, Any]:
        op = request.op
        self._refuse_unless_active(op)
        if not is_admin(peer, self._config().admin_group):
            log.warning("control.refused", uid=peer.uid)
            return {"ok": False, "exit_code": 2, "error": refusal(actor, op, self._config().admin_group)}
        if dropped := _expired(request, client_alive):
            log.warning("control.dropped", why=dropped)
            return {"ok": False, "exit_code": 5, "error": f"{op} dropped: {dropped}"}
        if isinstance(request, rq.DriftScan):
            # Not under the lock as a whole: only the judging and acting part takes it.
            return {"ok": True, "result": self._drift_scan(request, actor)}
        if isinstance(request, rq.CheckpointsPrune):
            # Likewise: the upkeep takes the lock for the re-checks and the deletes only.
            return {"ok": True, "result": self._upkeep.prune_request(
                request.run_id, actor=actor, keep_last=request.keep_last,
                keep_hourly_for=request.keep_hourly_for, keep_daily_for=request.keep_daily_for)}
        if isinstance(request, rq.Drill):
            # Takes the lock for its checks and record only: the failure is injected outside it.
            return {"ok": True, "result": self._drills().start(
                request.run_id, node=request.node, method=request.method,
                timeout_s=float(request.timeout_s), actor=actor,
                dropped=lambda: _expired(request, client_alive))}
        if isinstance(request, rq.Wake):
            log.info("control.wake", by=actor, why=request.why[:200])
            self._wake()
            return {"ok": True, "result": {}}
        if self._drift is not None and isinstance(request, rq.Submit | rq.Resubmit):
            # A fresh view of drift before placing a run (outside the lock: SSH).
            self._drift.scan_if_stale(self._clock())
        with self._lock:
            # Checked again here: the request may have waited for the lock
            # (or the process may have been frozen) since it arrived.
            if dropped := _expired(request, client_alive):
                log.warning("control.dropped", why=dropped)
                return {"ok": False, "exit_code": 5, "error": f"{op} dropped: {dropped}"}
            self._refuse_unless_active(op)
            # Prove the lease before the first write of the request, not only at
            # its Slurm call: an intent written by a fenced daemon would be
            # carried out by the next active one.
            self._fence.check(f"request {op} from {actor}")
            result = self._act(request, actor)
        self._wake()
        return {"ok": True, "result": result}

    def _drills(self) -> DrillWatch:
        if self._drill_watch is None:
            raise UsageError("this b300d runs no failure drills")
        return self._drill_watch

    def _refuse_unless_active(self, op: str) -> None:
        role = self._role()
        if role != "active":
            raise FencedError(f"this b300d is {role}, not active: {op} not done{self._active_holder()}")

    # -- the changes ---------------------------------------------------------

    def _act(self, request: rq._Request, actor: str) -> dict[str, Any]:
        if isinstance(request, rq.NodeResume):
            return self._node_resume(request.node, actor)
        if isinstance(request, rq.NodeTriage):
            return node_triage_request(self._store, self._config().triage, request.node,
                                       returnable=request.returnable, actor=actor, now=self._clock())
        if isinstance(request, rq.Submit):
            spec = parse_spec(request.spec_toml, where=request.where)
            if spec.checkpoint.dir and (why := checkpoint_dir_problem(
                    spec.checkpoint.dir, self._config().checkpoints.roots)):
                raise UsageError(why)
            run = self._actions.submit(spec, request.spec_toml, actor=actor)
        elif isinstance(request, rq.Cancel):
            run = self._actions.cancel(request.run_id, actor=actor)
        elif isinstance(request, rq.Resubmit):
            run = self._actions.resubmit(request.run_id, actor=actor, exclude=request.exclude,
                                         resume_from=request.resume_from, force=request.force,
                                         from_scratch=request.from_scratch)
        else:  # a model in MODELS without a branch here is a bug
            raise UsageError(f"request {request.op!r} is not handled")
        return self._run_reply(run)

    def _node_resume(self, node: str, actor: str) -> dict[str, Any]:
        known = {n.name for n in self._store.list_nodes()}
        if known and node not in known:
            raise NotFoundError(f"unknown node {node!r}")
        NodeActions(self._store, self._slurm, self._clock).resume(node, actor=actor)
        return {"node": node}

    def _drift_scan(self, request: rq.DriftScan, actor: str) -> dict[str, Any]:
        if self._drift is None:
            raise UsageError("version drift is not configured (no [drift] in the config)")
        return self._drift.scan_request(request.nodes, actor)

    def _status(self, request: rq.Status) -> dict[str, Any]:
        """A read for ``b300ctl status`` from the store the daemon has open (no lock), so
        that b300ctl need not import the store; answered, like ping, to anyone who may
        connect to the socket."""
        config = self._config()
        view = status_view(self._store, {"run": request.run, "all": request.all},
                           lease_name=config.lease_name, state_dir=config.state_dir, now=self._clock())
        return {**view, "daemon": self._ping()}

    def _run_reply(self, run: Run) -> dict[str, Any]:
        return {"run": run_to_dict(run),
                "attempts": [attempt_to_dict(a) for a in self._store.attempts(run.id)]}


def _expired(request: rq._Request, client_alive: Callable[[], bool] | None) -> str | None:
    """Why a request must be dropped (its deadline passed, its client left), or None."""
    if request.deadline is not None:
        # b300ctl and b300d share the host (Unix socket), so their clocks are one.
        late = time.time() - float(request.deadline)
        if late > 0:
            return f"its deadline passed {late:.1f} s ago"
    if client_alive is not None and not client_alive():
        return "its client is gone"
    return None
