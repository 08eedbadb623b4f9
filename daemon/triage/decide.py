"""Node triage's decisions, pure: the nodes, each node's triage history, the config and
now in; what to do out. No Slurm, no store, no clock (:mod:`b300.triage.slurm` acts).

A node's history (:class:`NodeHistory`) is read from its events: drains (``node.drained``,
``drift.drained``), ``triage.started``, ``triage.reboot``, ``triage.verdict``,
``triage.override``, ``node.resumed``. A triage is *open* from its ``triage.started`` until its
``triage.verdict``: a daemon killed between the two finds it open after restart and
finishes it (its reservation and job are found by name in Slurm).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..cycle.node_actions import rebooting
from ..events import Kind
from ..model import Event, NodeObservation
from ..payloads import TriageOverride
from .checks import CheckTable, TriageConfig

#: The reservation and job of a node's triage: found again by these names after a restart.
PREFIX = "b300-triage-"
#: Slurm's DRAIN reason of a node triage kept out starts with this (never triaged again).
REASON_PREFIX = "b300: triage"
#: Time the job is given on top of its checks' timeouts (start-up, the script's own work).
JOB_MARGIN_S = 60.0


def triage_name(node: str) -> str:
    """The reservation and job name of ``node``'s triage."""
    return f"{PREFIX}{node}"


def cause_of(reason: str) -> str | None:
    """The drain cause in a reason the daemon wrote; None: not the daemon's drain (a person's,
    or one triage itself made), never triaged."""
    r = reason.strip()
    if not r.startswith("b300:") or r.startswith(REASON_PREFIX):
        return None
    body = r[len("b300:"):].strip()
    for prefix, cause in (("straggler", "straggler"), ("black hole", "blackhole"), ("node dead", "liveness"),
                          ("drift", "drift"), ("drill", "drill"), ("run ", "attempt")):
        if body.startswith(prefix):
            return cause
    return "attempt" if "job" in body else "drift" if "drift" in body else None


def is_drained(state: str) -> bool:
    s = state.upper()
    return "DRAIN" in s or "DOWN" in s or s.startswith("FAIL")


def ready_for_checks(n: NodeObservation) -> bool:
    """Drained and free: no job left on it (a drain waits for its jobs: a straggler's run
    goes on until it ends), answering (``*``: not responding, ``~``: powered off)."""
    s = n.state.upper() + "".join(n.flags)
    busy = any(w in s for w in ("DRAINING", "DRNG", "ALLOC", "MIX", "COMPLETING"))
    return not busy and not any(c in s for c in "*~#")


@dataclass
class NodeHistory:
    """One node's triage-relevant events, oldest first, as plain facts."""

    node: str
    drains: list[datetime] = field(default_factory=list)
    started: Event | None = None            # the newest triage.started
    verdict: Event | None = None            # the newest triage.verdict
    reboot: Event | None = None             # the newest triage.reboot
    override_at: datetime | None = None     # the newest "returnable" override
    requested_at: datetime | None = None    # the newest operator's request to triage it
    returned_at: datetime | None = None     # the newest node.resumed (by triage or a person)

    @property
    def open(self) -> bool:
        """A triage started and not judged yet."""
        return self.started is not None and (self.verdict is None or self.verdict.id < self.started.id)

    @property
    def rebooted(self) -> Event | None:
        """The ``triage.reboot`` of the open triage (at most one: a node is rebooted once)."""
        if not self.open or self.reboot is None or self.started is None:
            return None
        return self.reboot if self.verdict is None or self.reboot.id > self.verdict.id else None

    def drains_within(self, now: datetime, window_s: float) -> int:
        since = now - timedelta(seconds=window_s)
        if self.override_at is not None:
            since = max(since, self.override_at)
        return sum(1 for t in self.drains if t >= since)


def histories(events: Iterable[Event]) -> dict[str, NodeHistory]:
    """Every node's :class:`NodeHistory` from its events (any order)."""
    out: dict[str, NodeHistory] = {}
    for e in sorted(events, key=lambda e: e.id):
        if not e.node:
            continue
        h = out.setdefault(e.node, NodeHistory(e.node))
        if e.kind in (Kind.NODE_DRAINED, Kind.DRIFT_DRAINED):
            h.drains.append(e.ts)
        elif e.kind == Kind.TRIAGE_STARTED:
            h.started = e
        elif e.kind == Kind.TRIAGE_VERDICT:
            h.verdict = e
        elif e.kind == Kind.TRIAGE_REBOOT:
            h.reboot = e
        elif e.kind == Kind.NODE_RESUMED:
            h.returned_at = e.ts
        elif e.kind == Kind.TRIAGE_OVERRIDE:
            override = TriageOverride.of(e)
            if override.returnable:
                h.override_at = e.ts
            if override.triage:
                h.requested_at = e.ts
    return out


@dataclass(frozen=True, slots=True)
class Start:
    """Reserve ``node`` alone and run its checks."""

    node: str
    cause: str
    reason: str
    checks: tuple[CheckTable, ...]

    @property
    def time_limit_s(self) -> float:
        return time_limit_s(self.checks)


@dataclass(frozen=True, slots=True)
class Lemon:
    """``node`` was drained ``drains`` times within the window: never returned automatically."""

    node: str
    cause: str | None
    reason: str
    drains: int


@dataclass(frozen=True, slots=True)
class Follow:
    """An open triage of ``node``: look at its job (the effects finish it when it ended)."""

    node: str
    started: Event


Action = Start | Lemon | Follow


def time_limit_s(checks: Sequence[CheckTable]) -> float:
    """The triage job's time limit: the sum of its checks' timeouts, plus a margin."""
    return sum(c.timeout_s for c in checks) + JOB_MARGIN_S


def decide(nodes: Sequence[NodeObservation], hist: Mapping[str, NodeHistory], cfg: TriageConfig,
           now: datetime) -> list[Action]:
    """What to do now: follow every open triage; for each drained node the daemon drained
    that has no verdict since its newest drain, start a triage (at most ``max_parallel``
    open at once) or, if it was drained ``lemon_drains`` times in ``lemon_window_s``,
    judge it a lemon without checks. A node an operator asked for (``b300ctl nodes triage``)
    is triaged once more whatever drained it. Nothing when ``[triage]`` is off."""
    if not cfg.enabled:
        return []
    actions: list[Action] = []
    open_ = [h for h in hist.values() if h.open]
    actions += [Follow(h.node, h.started) for h in open_ if h.started is not None]
    slots = cfg.max_parallel - len(open_)
    for n in sorted(nodes, key=lambda n: n.name):
        if not is_drained(n.state) or not ready_for_checks(n):
            continue   # a node still running jobs, or not answering, is looked at again later
        h = hist.get(n.name) or NodeHistory(n.name)
        requested = h.requested_at is not None and (h.verdict is None or h.requested_at > h.verdict.ts)
        cause = cause_of(n.reason) or ("manual" if requested else None)
        if cause is None or h.open:
            continue
        newest_drain = h.drains[-1] if h.drains else None
        back_since = h.returned_at is not None and h.verdict is not None and h.returned_at >= h.verdict.ts
        if not requested and not back_since and h.verdict is not None and (
                newest_drain is None or h.verdict.ts >= newest_drain):
            continue   # judged since its newest drain and not back since: a person's turn
        drains = h.drains_within(now, cfg.lemon_window_s)
        if drains >= cfg.lemon_drains:
            actions.append(Lemon(n.name, cause, n.reason, drains))
            continue
        if slots <= 0:
            continue
        checks = cfg.checks_for(cause)
        if not checks:
            continue
        actions.append(Start(n.name, cause, n.reason, checks))
        slots -= 1
    return actions


#: What the reboot of an open triage needs now (:func:`reboot_phase`).
SEND, WAIT, REBOOTED, FAILED = "send", "wait", "rebooted", "failed"


def reboot_phase(n: NodeObservation | None, reboot: Event, now: datetime, timeout_s: float) -> tuple[str, str]:
    """Where the reboot recorded by ``reboot`` (``triage.reboot``, written before ``scontrol
    reboot``) stands, read from Slurm's node state alone (level-triggered: a daemon killed
    between the record and the command, or after it, decides the same again), with why:

    * ``wait``: a reboot requested or under way (``reboot``, ``@``, ``^``), or the node not
      answering / powered off / powering up (``*``, ``~``, ``#``);
    * ``rebooted``: DOWN and answering: ``nextstate=DOWN`` after the reboot (the checks run again);
    * ``failed``: DOWN with "reboot timed out" (Slurm's ResumeTimeout), or nothing done
      within ``timeout_s`` of the record;
    * ``send``: none of these (idle in its reservation): the reboot never reached Slurm.
    """
    waited = (now - reboot.ts).total_seconds()
    late = waited > timeout_s
    if n is None:
        if late:
            return FAILED, f"node gone from Slurm {waited:.0f} s after its reboot"
        return WAIT, "node not listed"
    state = n.state.upper()
    if "DOWN" in state and "reboot timed out" in n.reason.lower():
        return FAILED, f"reboot timed out (Slurm: {n.reason})"[:300]
    if rebooting(n) or any(f in ("*", "~", "#") for f in n.flags):
        if late:
            return FAILED, f"reboot not done after {waited:.0f} s ({state.lower()}{''.join(n.flags)})"
        return WAIT, f"{state.lower()}{''.join(n.flags)}"
    if "DOWN" in state:
        return REBOOTED, n.reason[:300]
    if late:
        return FAILED, f"no reboot in {waited:.0f} s ({state.lower()})"
    return SEND, state.lower()


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str                    # "pass" or "fail"
    failed_check: str | None
    evidence: str
    checks: tuple[dict[str, str], ...]


def judge(output: str, exit_code: int | None, job_state: str, checks: Sequence[str]) -> Verdict:
    """The verdict of a triage job from its output (the job script's JSON lines: one
    ``{"check": ..., "status": ..., "evidence": ...}`` per check, ``{"step": NAME,
    "exit": CODE}`` after each configured step), its exit code and final Slurm state.
    Pass only if the job completed with 0 and every step exited 0; else the first failed
    check (or step, or the job's end) names the failure."""
    rows: list[dict[str, str]] = []
    steps: dict[str, int] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        if "check" in doc and "status" in doc:
            rows.append({k: str(doc.get(k, "")) for k in ("check", "status", "evidence")})
        elif "step" in doc and "exit" in doc:
            try:
                steps[str(doc["step"])] = int(doc["exit"])
            except (TypeError, ValueError):
                steps[str(doc["step"])] = -1
    failed = [r for r in rows if r["status"] == "fail"]
    if failed:
        first = failed[0]
        return Verdict("fail", first["check"], f"{first['check']}: {first['evidence']}"[:400], tuple(rows))
    for name in checks:
        code = steps.get(name)
        if code is None:
            return Verdict("fail", name, f"{name}: did not run to its end (job {job_state}, exit {exit_code})",
                           tuple(rows))
        if code != 0:
            why = "timed out" if code == 124 else f"exited {code}"
            return Verdict("fail", name, f"{name}: {why}", tuple(rows))
    if job_state != "COMPLETED" or (exit_code not in (0, None)):
        return Verdict("fail", "job", f"triage job ended {job_state} (exit {exit_code})", tuple(rows))
    passed = sum(1 for r in rows if r["status"] == "pass")
    skipped = [r["check"] for r in rows if r["status"] == "skip"]
    ev = f"{len(checks)} steps passed, {passed} checks passed"
    if skipped:
        ev += f", skipped: {', '.join(skipped)}"
    return Verdict("pass", None, ev, tuple(rows))


def fail_reason(failed_check: str | None, evidence: str) -> str:
    """The DRAIN reason a failed triage leaves: names the failed check (short, one line)."""
    return f"{REASON_PREFIX} failed {failed_check or '?'}: {evidence}"[:200]


def lemon_reason(drains: int, window_s: float) -> str:
    return f"{REASON_PREFIX} lemon: drained {drains} times in {window_s / 86400:g} days"[:200]
