"""Node triage's effects: the one place it changes Slurm and records events.

Each upkeep (from the poll cycle, under the action lock, as the lease holder: every
changing call goes through :class:`b300.ha.fence.FencedSlurm`) reads the nodes and the
triage events, asks :func:`b300.triage.decide.decide` what to do, and does it:

* start: ``triage.started`` is recorded first (the intent), then the reservation
  ``b300-triage-NODE`` (that node alone) is made, the node resumed inside it (only the
  reservation's jobs may land there) and the job ``b300-triage-NODE`` submitted in it,
  with a time limit of its checks' timeouts plus a margin;
* follow: an open triage whose reservation or job is missing (a daemon killed between
  the intent and the submit) is completed; one whose job ended is judged
  (:func:`~b300.triage.decide.judge`): pass -> the reservation is deleted and the node is
  back (refilling a spare pool at the pools' next upkeep, when one is short); fail -> the
  node is drained again with a reason naming the failed check, then the reservation is
  deleted; either way one ``triage.verdict`` with the evidence;
* lemon: the node stays drained, its reason says so, one ``triage.verdict`` (lemon).

In observe mode (or with recovery off) nothing is done: each action is one
``action.withheld`` event.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import structlog

from ..cycle.node_actions import NodeActions
from ..errors import NotFoundError, SlurmError, UsageError
from ..events import TRIAGE, Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import SubmitRequest
from ..payloads import TriageStarted
from ..spares.pool import parse_reservations
from ..spares.pools import daemon_user
from . import node_check
from .checks import CheckTable, TriageConfig
from .decide import (
    PREFIX,
    Follow,
    Lemon,
    NodeHistory,
    Start,
    decide,
    fail_reason,
    histories,
    judge,
    lemon_reason,
    time_limit_s,
    triage_name,
)

log = structlog.get_logger(__name__)
#: An open triage with no job this long after its intent gets its job (again).
SUBMIT_GRACE_S = 30.0
#: In a check's argv or args: the node's name.
NODE = "{node}"


def job_script(node: str, checks: tuple[CheckTable, ...]) -> str:
    """The triage job's bash script: each check under ``timeout``, a ``{"step": NAME, "exit": CODE}``
    line after each (124: timed out). The shipped check is inlined (run with ``python3 -``).
    ``{node}`` in an argv or args element is the node's name."""
    shipped = Path(node_check.__file__).read_text(encoding="utf-8")
    lines = ["#!/bin/bash", "set -u", f"# b300 triage of {node}",
             'step() { printf \'{"step": "%s", "exit": %d}\\n\' "$1" "$2"; }']
    for c in checks:
        t = max(1, int(c.timeout_s))
        if c.argv:
            lines.append(f"timeout -k 10 {t} {' '.join(shlex.quote(a.replace(NODE, node)) for a in c.argv)}")
        else:
            args = " ".join(shlex.quote(a.replace(NODE, node)) for a in c.args)
            lines += [f"timeout -k 10 {t} python3 - {args} <<'B300_NODE_CHECK'",
                      shipped.rstrip("\n"), "B300_NODE_CHECK"]
        lines.append(f"step {shlex.quote(c.name)} $?")
    return "\n".join(lines) + "\n"


def node_triage_request(store: Store, cfg: TriageConfig, node: str, *, returnable: bool, actor: str,
                        now: datetime) -> dict[str, object]:
    """An operator's ``b300ctl nodes triage NODE [--returnable]``: one ``triage.override``
    event; the next upkeep triages the node if it is drained (``returnable``: drains before
    now no longer count towards a lemon)."""
    if not cfg.enabled:
        raise UsageError("node triage is off ([triage] enabled = false in the config)")
    known = {n.name for n in store.list_nodes()}
    if known and node not in known:
        raise NotFoundError(f"unknown node {node!r}")
    store.append_events([NewEvent(Kind.TRIAGE_OVERRIDE, node=node, actor=actor, data={
        "triage": True, "returnable": returnable, "by": actor})], now)
    return {"node": node, "returnable": returnable}


class NodeTriage:
    """``[triage]``'s upkeep. Not thread-safe: callers hold the action lock."""

    def __init__(self, store: Store, slurm: SlurmClient, clock: Callable[[], datetime],
                 config: Callable[[], TriageConfig], *, job_log_dir: str, act: bool,
                 withheld: Callable[..., None] | None = None) -> None:
        self._store, self._slurm, self._clock, self._config = store, slurm, clock, config
        self._nodes = NodeActions(store, slurm, clock)
        self._log_dir = job_log_dir
        self._act = act
        self._withheld = withheld
        self._next_at = 0.0

    def output_path(self, node: str) -> str:
        return os.path.join(self._log_dir, f"{triage_name(node)}.out")

    def upkeep(self, *, force: bool = False) -> int:
        """One look at the drained nodes if ``interval_s`` passed (or ``force``); the number
        of actions taken."""
        cfg = self._config()
        if not cfg.enabled:
            return 0
        now = self._clock()
        if not force and now.timestamp() < self._next_at:
            return 0
        self._next_at = now.timestamp() + cfg.interval_s
        nodes = self._slurm.nodes()
        hist = histories(self._store.events(kinds=list(TRIAGE)))
        done = 0
        for action in decide(nodes, hist, cfg, now):
            try:
                if isinstance(action, Follow):
                    done += self._follow(cfg, action, hist[action.node], now)
                elif not self._act:
                    if self._withheld is not None:
                        what = "triage" if isinstance(action, Start) else "lemon"
                        self._withheld(what, action.node, now, node=action.node, detail=action.reason)
                elif isinstance(action, Start):
                    done += self._start(cfg, action, now)
                elif isinstance(action, Lemon):
                    done += self._lemon(cfg, action, now)
            except SlurmError as exc:
                log.warning("triage.failed", node=action.node, error=str(exc)[:300])
        return done

    # -- start -------------------------------------------------------------

    def _start(self, cfg: TriageConfig, a: Start, now: datetime) -> int:
        name = triage_name(a.node)
        self._store.append_events([NewEvent(Kind.TRIAGE_STARTED, node=a.node, data={
            "cause": a.cause, "reason": a.reason, "reservation": name, "job_name": name,
            "checks": [c.name for c in a.checks], "time_limit_s": a.time_limit_s, "step": "reserve"})], now)
        log.info("triage.started", node=a.node, cause=a.cause, checks=[c.name for c in a.checks])
        self._launch(cfg, a.node, a.checks, reserved=False)
        return 1

    def _partition(self, cfg: TriageConfig) -> str:
        part = cfg.partition or self._slurm.default_partition()
        if not part:
            raise SlurmError("[triage] partition is empty and the cluster has no default partition",
                             transient=False)
        return part

    def _launch(self, cfg: TriageConfig, node: str, checks: tuple[CheckTable, ...], *, reserved: bool) -> int:
        """Reservation (if missing), node resumed inside it, job submitted; the job id."""
        name = triage_name(node)
        part = self._partition(cfg)
        if not reserved:
            self._slurm.create_reservation(name, [node], users=cfg.user or daemon_user(), partition=part)
        # Into its reservation: not a return to service (the verdict's node.resumed is that).
        self._nodes.resume(node, record=False)
        Path(self._log_dir).mkdir(parents=True, exist_ok=True)
        out = self.output_path(node)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)   # an earlier triage's output is never judged again
        minutes = max(1, math.ceil(time_limit_s(checks) / 60.0))
        job_id = self._slurm.submit(SubmitRequest(
            job_name=name, comment=f"b300 triage of {node}", script=job_script(node, checks), nodes=1,
            gpus_per_node=0, partition=part, time_limit=str(minutes), output=out, reservation=name))
        log.info("triage.submitted", node=node, job_id=job_id, time_limit_min=minutes)
        return job_id

    # -- follow ------------------------------------------------------------

    def _follow(self, cfg: TriageConfig, f: Follow, h: NodeHistory, now: datetime) -> int:
        name = triage_name(f.node)
        jobs = self._slurm.find_by_name(name, since=f.started.ts)
        started = TriageStarted.of(f.started)
        checks = tuple(c for c in cfg.check if c.name in started.checks)
        if not jobs:
            if (now - f.started.ts).total_seconds() < SUBMIT_GRACE_S or not self._act:
                return 0
            reserved = any(r.name == name for r in parse_reservations(self._slurm.reservation_list()))
            if not checks:
                checks = cfg.checks_for(started.cause or "attempt")
            job_id = self._launch(cfg, f.node, checks, reserved=reserved)
            self._store.append_events([NewEvent(Kind.TRIAGE_STARTED, node=f.node, data={
                **f.started.data, "job_id": job_id, "step": "submitted"})], now)
            return 1
        job = jobs[-1]
        if not job.state.is_terminal:
            return 0
        if not self._act:
            return 0
        try:
            output = Path(self.output_path(f.node)).read_text(encoding="utf-8", errors="replace")
        except OSError:
            output = ""
        names = list(started.checks)
        v = judge(output, job.exit_code, job.state.value, names)
        drains = h.drains_within(now, cfg.lemon_window_s)
        resumed = v.verdict == "pass" and cfg.resume
        if not resumed:
            why = fail_reason(v.failed_check, v.evidence) if v.verdict == "fail" else \
                f"b300: triage passed, [triage] resume = false: {v.evidence}"[:200]
            self._nodes.drain(f.node, why, nodes_now={}, record=False)  # recorded as the verdict
        self._delete_reservation(name)
        self._store.append_events([NewEvent(Kind.TRIAGE_VERDICT, node=f.node, data={
            "verdict": v.verdict, "failed_check": v.failed_check, "evidence": v.evidence,
            "checks": list(v.checks), "job_id": job.job_id, "drains": drains, "resumed": resumed})], now)
        if resumed:
            self._store.append_events([NewEvent(Kind.NODE_RESUMED, node=f.node, actor="triage",
                                                data={"by": "triage"})], now)
        log.info("triage.verdict", node=f.node, verdict=v.verdict, failed=v.failed_check, resumed=resumed)
        return 1

    def _delete_reservation(self, name: str) -> None:
        if any(r.name == name for r in parse_reservations(self._slurm.reservation_list())):
            self._slurm.delete_reservation(name)

    # -- lemon -------------------------------------------------------------

    def _lemon(self, cfg: TriageConfig, a: Lemon, now: datetime) -> int:
        self._nodes.drain(a.node, lemon_reason(a.drains, cfg.lemon_window_s), nodes_now={}, record=False)
        self._store.append_events([NewEvent(Kind.TRIAGE_VERDICT, node=a.node, data={
            "verdict": "lemon", "failed_check": None, "drains": a.drains, "resumed": False,
            "evidence": f"drained {a.drains} times within {cfg.lemon_window_s / 86400:g} days; "
                        f"last reason: {a.reason}"[:400]})], now)
        log.warning("triage.lemon", node=a.node, drains=a.drains)
        return 1


__all__ = ["PREFIX", "NodeTriage", "job_script"]
