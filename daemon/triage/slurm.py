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
  back (into a spare pool of its partition that is short, ``pool_for``, else to general
  use); fail -> with ``[triage] reboot`` and no reboot yet in this triage, ``triage.reboot``
  is recorded, the node rebooted (``scontrol reboot ASAP nextstate=DOWN``: it stays in its
  reservation, and DOWN after the reboot) and, once Slurm shows it back, checked again
  (:func:`~b300.triage.decide.reboot_phase`, read from Slurm's node state: a reboot is
  sent at most once); else the node is drained again with a reason naming the failed
  check, then the reservation is deleted; either way one ``triage.verdict`` with the evidence;
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
from typing import Protocol

import structlog

from ..cycle.node_actions import NodeActions
from ..errors import NotFoundError, SlurmError, UsageError
from ..events import TRIAGE, Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Event, NodeObservation, SubmitRequest
from ..payloads import TriageReboot, TriageStarted
from ..spares.pool import parse_reservations
from ..spares.pools import daemon_user
from . import node_check
from .checks import CheckTable, TriageConfig
from .decide import (
    FAILED,
    PREFIX,
    REASON_PREFIX,
    REBOOTED,
    SEND,
    Follow,
    Lemon,
    NodeHistory,
    Start,
    decide,
    fail_reason,
    histories,
    judge,
    lemon_reason,
    reboot_phase,
    time_limit_s,
    triage_name,
)

log = structlog.get_logger(__name__)
#: An open triage with no job this long after its intent gets its job (again).
SUBMIT_GRACE_S = 30.0
#: In a check's argv or args: the node's name.
NODE = "{node}"


class PoolRefill(Protocol):
    """What triage asks of the spare pools (:class:`b300.spares.pools.SparePools`)."""

    def short_pool_for(self, node: str) -> str | None:
        """The reservation of a pool of ``node``'s partition holding fewer idle nodes than its size."""
        ...

    def take(self, reservation: str, node: str) -> None:
        """Add ``node`` to that pool's reservation (nothing if it holds it already)."""
        ...


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
                 withheld: Callable[..., None] | None = None,
                 pools: PoolRefill | None = None) -> None:
        # ``pools``: the daemon's spare pools (b300.spares.pools.SparePools): a passed node
        # goes to a short one of its partition first; None: no pools.
        self._store, self._slurm, self._clock, self._config = store, slurm, clock, config
        self._nodes = NodeActions(store, slurm, clock)
        self._log_dir = job_log_dir
        self._act = act
        self._withheld = withheld
        self._pools = pools
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
        seen = {n.name: n for n in nodes}
        done = 0
        for action in decide(nodes, hist, cfg, now):
            try:
                if isinstance(action, Follow):
                    done += self._follow(cfg, action, hist[action.node], seen.get(action.node), now)
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

    def _follow(self, cfg: TriageConfig, f: Follow, h: NodeHistory, seen: NodeObservation | None,
                now: datetime) -> int:
        name = triage_name(f.node)
        reboot = h.rebooted
        after = (TriageReboot.of(reboot).job_id or 0) if reboot is not None else 0
        # After a reboot only the job that checks the node again counts (the first one ended).
        jobs = [j for j in self._slurm.find_by_name(name, since=f.started.ts) if j.job_id > after]
        started = TriageStarted.of(f.started)
        checks = tuple(c for c in cfg.check if c.name in started.checks)
        if not checks:
            checks = cfg.checks_for(started.cause or "attempt")
        if not jobs and reboot is not None and f.started.id < reboot.id:
            return self._after_reboot(cfg, f, h, reboot, seen, checks, now) if self._act else 0
        if not jobs:
            if (now - f.started.ts).total_seconds() < SUBMIT_GRACE_S or not self._act:
                return 0
            reserved = any(r.name == name for r in parse_reservations(self._slurm.reservation_list()))
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
        if v.verdict == "fail" and cfg.reboot and reboot is None:
            return self._reboot(cfg, h, v.failed_check, v.evidence, job.job_id, seen, now)
        evidence = v.evidence
        if reboot is not None:
            first = TriageReboot.of(reboot).evidence
            evidence = f"{'after a reboot' if v.verdict == 'pass' else 'again after a reboot'}: {evidence}" \
                       f" (before it: {first})"
        return self._verdict(cfg, f.node, h, v.verdict, v.failed_check, evidence[:400], list(v.checks),
                             job.job_id, now, rebooted=reboot is not None)

    def _verdict(self, cfg: TriageConfig, node: str, h: NodeHistory, verdict: str, failed_check: str | None,
                 evidence: str, checks: list[dict[str, str]], job_id: int | None, now: datetime, *,
                 rebooted: bool) -> int:
        """Record the verdict of an open triage and carry it out: a pass returns the node (to a
        short spare pool of its partition first), a fail drains it with the failed check."""
        name = triage_name(node)
        drains = h.drains_within(now, cfg.lemon_window_s)
        resumed = verdict == "pass" and cfg.resume
        pool = self._pools.short_pool_for(node) if resumed and self._pools is not None else None
        if not resumed:
            why = fail_reason(failed_check, evidence) if verdict == "fail" else \
                f"b300: triage passed, [triage] resume = false: {evidence}"[:200]
            self._nodes.drain(node, why, nodes_now={}, record=False)  # recorded as the verdict
        elif pool is not None:
            # Drained while it leaves the triage reservation for the pool's: no job of the
            # queue lands on it in between (the pool's refill then resumes nothing: resumed here).
            self._nodes.drain(node, f"{REASON_PREFIX} passed, into spare pool {pool}"[:200], nodes_now={},
                              record=False)
        self._delete_reservation(name)
        if pool is not None:
            try:
                if self._pools is not None:
                    self._pools.take(pool, node)
            except SlurmError as exc:
                if exc.transient:
                    raise      # decided again at the next look (every step above is idempotent)
                log.warning("triage.pool_refused", node=node, pool=pool, error=str(exc)[:200])
                pool = None    # Slurm refused: back to general use
            self._nodes.resume(node, record=False)
        data: dict[str, object] = {
            "verdict": verdict, "failed_check": failed_check, "evidence": evidence, "checks": checks,
            "job_id": job_id, "drains": drains, "resumed": resumed, "rebooted": rebooted}
        if pool is not None:
            data["pool"] = pool
        self._store.append_events([NewEvent(Kind.TRIAGE_VERDICT, node=node, data=data)], now)
        if resumed:
            self._store.append_events([NewEvent(Kind.NODE_RESUMED, node=node, actor="triage",
                                                data={"by": "triage"})], now)
        log.info("triage.verdict", node=node, verdict=verdict, failed=failed_check, resumed=resumed, pool=pool)
        return 1

    # -- reboot ------------------------------------------------------------

    def _reboot(self, cfg: TriageConfig, h: NodeHistory, failed_check: str | None, evidence: str,
                job_id: int, seen: NodeObservation | None, now: datetime) -> int:
        """The checks failed and ``[triage] reboot`` is on: record the reboot (the intent), then
        ask Slurm for it. The node stays in its reservation; the next looks follow the reboot."""
        reason = f"{REASON_PREFIX} reboot after {failed_check or '?'} failed"[:200]
        data: dict[str, object] = {"failed_check": failed_check, "evidence": evidence, "job_id": job_id,
                                   "reason": reason}
        self._store.append_events([NewEvent(Kind.TRIAGE_REBOOT, node=h.node, data=data)], now)
        log.warning("triage.reboot", node=h.node, failed=failed_check)
        return self._send_reboot(cfg, h, data, seen, now)

    def _send_reboot(self, cfg: TriageConfig, h: NodeHistory, reboot: dict[str, object],
                     seen: NodeObservation | None, now: datetime) -> int:
        """``scontrol reboot``; Slurm's refusal (no RebootProgram) fails the node at once, with
        the check that failed before (a transient error: sent again at the next look)."""
        try:
            self._nodes.reboot(h.node, str(reboot.get("reason") or REASON_PREFIX), now=seen)
        except SlurmError as exc:
            if exc.transient:
                raise
            check = reboot.get("failed_check")
            return self._verdict(cfg, h.node, h, "fail", str(check) if check else None,
                                 f"{reboot.get('evidence')}; reboot refused by Slurm: {exc}"[:400], [], None,
                                 now, rebooted=False)
        return 1

    def _after_reboot(self, cfg: TriageConfig, f: Follow, h: NodeHistory, reboot: Event,
                      seen: NodeObservation | None, checks: tuple[CheckTable, ...], now: datetime) -> int:
        """The reboot recorded, no job since: send it (never sent), wait, run the checks again
        (the node is back), or fail the node (Slurm timed the reboot out, or ours did)."""
        phase, why = reboot_phase(seen, reboot, now, cfg.reboot_timeout_s)
        if phase == SEND:
            return self._send_reboot(cfg, h, reboot.data, seen, now)
        if phase == FAILED:
            evidence = f"{why}; before it: {TriageReboot.of(reboot).evidence}"[:400]
            return self._verdict(cfg, f.node, h, "fail", "reboot", evidence, [], None, now, rebooted=True)
        if phase != REBOOTED:
            return 0
        # Recorded first: a daemon killed after the node is resumed never reboots it again.
        self._store.append_events([NewEvent(Kind.TRIAGE_STARTED, node=f.node, data={
            **f.started.data, "step": "rebooted"})], now)
        self._launch(cfg, f.node, checks, reserved=any(
            r.name == triage_name(f.node) for r in parse_reservations(self._slurm.reservation_list())))
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
