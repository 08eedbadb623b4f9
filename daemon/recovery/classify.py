"""How an attempt ended, and what may be done about it (pure functions).

See ../shared/FIELD-NOTES.md, "Ending states": infrastructure failures are
resubmitted away from the nodes behind them; the job's own errors are not,
unless the spec marks the exit code retryable; a timeout is resubmitted only
when the job checkpoints. A FAILED job whose peers died (gloo "Connection
closed by peer", NCCL errors) usually ends before Slurm has noticed the dead
node: the verdict is then to *wait* (up to a settle time) for Slurm to show
which node it was, so that the resubmission can avoid it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..events import Kind
from ..model import Attempt, AttemptState, Event, NodeRecord
from ..payloads import NodeState, NodeStrike
from ..spec import JobSpec


class Outcome(enum.StrEnum):
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"          # by a person (or b300ctl cancel)
    JOB_ERROR = "JOB_ERROR"          # the job's own doing: not resubmitted
    INFRA = "INFRA"                  # node, network or Slurm: resubmitted
    RETRYABLE_EXIT = "RETRYABLE_EXIT"  # an exit code the spec marks retryable
    HANG = "HANG"                    # no progress; cancelled by the daemon
    TIMEOUT = "TIMEOUT"              # hit its time limit
    PREEMPTED = "PREEMPTED"
    SIGNALLED = "SIGNALLED"          # ended within signal_grace of b300d's checkpoint signal: resubmitted


#: Outcomes that spend the infrastructure retry budget.
#: A TIMEOUT spends none: chaining time-limited jobs is how long runs normally go on.
INFRA_BUDGET = frozenset({Outcome.INFRA, Outcome.RETRYABLE_EXIT, Outcome.HANG})

# Lines of a job log that point at the infrastructure rather than the job's code.
_INFRA_LOG = re.compile(
    r"Connection closed by peer|Connection reset by peer|NCCL (?:WARN|error)|"
    r"nccl(?:System|Internal|Remote)Error|unhandled system error|"
    r"Watchdog caught collective operation timeout|NVRM: Xid|\bXid \d+|"
    r"uncorrectable ECC|Node failure on|DUE TO NODE FAILURE|"
    r"slurmstepd: error: .*(?:Node failure|lost contact)|"
    r"srun: error: .*(?:Connection refused|Task launch .* failed|Node failure)|"
    r"NCCL communicator was aborted|ProcessGroupGloo.*(?:timed out|Connection)",
    re.IGNORECASE,
)
# A Python exception's last line ("RuntimeError: bad value"), with torch's "[rank1]: "
# or srun's --label "1: " prefix.
_EXCEPTION_LINE = re.compile(
    r"^(?:\s*(?:\[rank\d+\]|\d+):\s*)?([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$")
# Exceptions a rank raises because a peer went away, not because of its own code.
_PEER_EXCEPTION = re.compile(r"Dist(?:Backend|Network|Store)Error|ChildFailedError|"
                             r"Broken pipe|Socket Timeout|Connection refused", re.IGNORECASE)
# srun's words about a task that ended: "srun: error: gpu01: task 1: Exited with exit code 1".
_SRUN_TASK = re.compile(r"srun: error: (?:[\w.-]+: )?tasks? [\d,-]+: (.*)$")
_NODE_IN_LOG = re.compile(r"(?:Node failure on|srun: error: Node failure on) ([A-Za-z0-9._-]+)")
# Node states (sinfo, base state) that mean "this node is not healthy".
_BAD_NODE_STATES = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING",
                              "NOT_RESPONDING", "UNKNOWN", "INVAL", "POWER_DOWN"})


@dataclass(frozen=True, slots=True)
class SignalSent:
    """The daemon's last checkpoint signal to an attempt (a ``checkpoint.signal`` event)."""

    at: datetime
    signal: str
    grace_s: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """What recovery concluded about an ended attempt.

    ``wait`` means "not decidable yet, ask again later"; ``suspects`` are
    nodes with direct evidence against them (drain them); ``implicated``
    are all nodes of an attempt that failed for infrastructure reasons with
    no clear culprit (they get a strike toward the black-hole threshold).
    """

    outcome: Outcome
    resubmit: bool
    suspects: tuple[str, ...] = ()
    implicated: tuple[str, ...] = ()
    wait: bool = False
    reasons: tuple[str, ...] = ()
    log_lines: tuple[str, ...] = ()

    def evidence(self) -> dict[str, object]:
        return {"outcome": self.outcome.value, "resubmit": self.resubmit,
                "suspects": list(self.suspects), "implicated": list(self.implicated),
                "reasons": list(self.reasons), "log": list(self.log_lines)}


def infra_log_lines(lines: Iterable[str], limit: int = 8) -> tuple[str, ...]:
    """The lines of a job log that point at the infrastructure (at most ``limit``)."""
    found = [line.strip()[:300] for line in lines if _INFRA_LOG.search(line)]
    return tuple(found[:limit])


def own_exception_lines(lines: Iterable[str], limit: int = 4) -> tuple[str, ...]:
    """A rank's own exception: the last lines of Python tracebacks in the log that are
    not a peer's connection error (the lines, at most ``limit``; empty without a traceback)."""
    lines = list(lines)
    if not any("Traceback (most recent call last)" in line for line in lines):
        return ()
    found = [line.strip()[:300] for line in lines
             if _EXCEPTION_LINE.match(line) and not _INFRA_LOG.search(line)
             and not _PEER_EXCEPTION.search(line)]
    return tuple(found[:limit])


def first_task_end(lines: Iterable[str]) -> str | None:
    """What srun said of the first task that ended badly (``Exited with exit code 1``,
    ``Killed``...), or ``None`` when it said nothing."""
    for line in lines:
        m = _SRUN_TASK.search(line)
        if m:
            return m.group(1).strip()
    return None


def node_is_bad(node: NodeRecord | None) -> bool:
    if node is None:
        return False
    return _bad(node.state, node.reason)


def _bad(state: str, reason: str) -> bool:
    return state.upper() in _BAD_NODE_STATES or "NOT RESPONDING" in reason.upper()


def classify_end(
    attempt: Attempt,
    spec: JobSpec,
    nodes_now: Mapping[str, NodeRecord],
    log_lines: Sequence[str],
    *,
    cancel_requested: bool,
    hang_detected: bool,
    now: datetime,
    settle_s: float,
    signal_sent: SignalSent | None = None,
    lost: Sequence[str] = (),
    node_health: Mapping[str, str] | None = None,
    detect_window_s: float = 0.0,
    drained_working: Collection[str] = (),
) -> Verdict:
    """Classify a terminal attempt. Pure: everything it needs is passed in.

    ``drained_working``: nodes of the attempt drained while it ran for a reason that is
    not a failure (a straggler under ``[training] straggler_action = "drain"``): not bad
    for this verdict, so a job's own error stays its own error; unless ``lost`` or
    ``node_health`` (``dead``) says it died, or the log names it.

    A job that failed within ``signal_grace`` of the daemon's checkpoint signal
    died of it (a batch shell that does not trap USR1 exits): SIGNALLED, the
    daemon's doing, resubmitted, never the job's error.

    ``lost`` are nodes the daemon's own checks confirmed dead while the attempt ran
    (it cancelled the attempt for them): an infrastructure failure with those nodes
    as suspects, whatever Slurm says yet. ``node_health`` is what those checks say of
    the attempt's nodes now (``dead``/``undecided``/``alive``/``unknown``; None: not
    watched): a failure with peer/NCCL errors in the log then waits only while a node
    is undecided, or until the checks had ``detect_window_s`` to see a node that died
    with the job, instead of ``settle_s`` for Slurm to name one."""
    state = attempt.state
    lost = tuple(n for n in lost if n in attempt.nodes)
    named = tuple(sorted({m.group(1) for line in log_lines for m in _NODE_IN_LOG.finditer(line)
                          if m.group(1) in attempt.nodes}))
    # Drained for a reason that is not a failure, and not seen failing since: not confirmed
    # dead by b300d's checks (lost, or dead now), not named by the job's log.
    working = {n for n in drained_working
               if n not in lost and n not in named and (node_health or {}).get(n) != "dead"}
    bad = tuple(n for n in attempt.nodes
                if (node_is_bad(nodes_now.get(n)) and n not in working) or n in lost)
    suspects = tuple(sorted(set(bad) | set(named)))
    infra_lines = infra_log_lines(log_lines)
    why = [f"slurm state {state.value}"]
    if attempt.exit_code is not None:
        why.append(f"exit {attempt.exit_code}:{attempt.signal or 0}")
    if lost:
        why.append("confirmed dead by b300d's checks: " + ", ".join(lost))
    if shown := [n for n in bad if n in nodes_now]:
        why.append("nodes now " + ", ".join(
            f"{n} {nodes_now[n].state.lower()} ({nodes_now[n].reason or 'no reason'})" for n in shown))

    def verdict(outcome: Outcome, resubmit: bool, **kw: object) -> Verdict:
        return Verdict(outcome=outcome, resubmit=resubmit, reasons=tuple(why),
                       log_lines=infra_lines, **kw)  # type: ignore[arg-type]

    if state is AttemptState.COMPLETED:
        return verdict(Outcome.COMPLETED, False)
    if state is AttemptState.CANCELLED:
        if lost:
            why.append("cancelled by b300d: its node is dead (the surviving ranks would hang)")
            return verdict(Outcome.INFRA, True, suspects=suspects)
        if hang_detected:
            why.append("cancelled by b300d: no progress")
            return verdict(Outcome.HANG, True, implicated=attempt.nodes)
        why.append("cancel requested through b300ctl" if cancel_requested
                   else "cancelled outside b300 (scancel)")
        return verdict(Outcome.CANCELLED, False)
    if state in (AttemptState.NODE_FAIL, AttemptState.BOOT_FAIL):
        return verdict(Outcome.INFRA, True, suspects=suspects,
                       implicated=() if suspects else attempt.nodes)
    if state is AttemptState.PREEMPTED:
        return verdict(Outcome.PREEMPTED, True)
    if state is AttemptState.TIMEOUT:
        checkpoints = spec.checkpoint.dir is not None
        why.append("job checkpoints: continue" if checkpoints else "job does not checkpoint")
        return verdict(Outcome.TIMEOUT, checkpoints)
    if state in (AttemptState.FAILED, AttemptState.ABANDONED):
        if suspects:
            return verdict(Outcome.INFRA, True, suspects=suspects)
        if signal_sent is not None and attempt.end is not None:
            after = (attempt.end - signal_sent.at).total_seconds()
            if -1.0 <= after <= signal_sent.grace_s:  # -1: Slurm's end time has whole seconds
                why.append(f"ended {max(0.0, after):.0f} s after b300d sent {signal_sent.signal} "
                           f"(within signal_grace {signal_sent.grace_s:.0f} s): the daemon's doing")
                return verdict(Outcome.SIGNALLED, True)
        own = own_exception_lines(log_lines)
        first = first_task_end(log_lines)
        if own and (first is None or first.startswith("Exited with exit code")):
            # A rank died of its own exception; its peers' "connection closed" follows from it.
            why.append(f"a rank raised {own[0]!r}"
                       + (f"; first failing task: {first}" if first else ""))
            if attempt.exit_code is not None and attempt.exit_code in spec.retries.retryable_exit_codes:
                why.append("exit code marked retryable in the spec")
                return verdict(Outcome.RETRYABLE_EXIT, True)
            return verdict(Outcome.JOB_ERROR, False)
        if infra_lines:
            waited = (now - (attempt.end or now)) / timedelta(seconds=1)
            health = {n: (node_health or {}).get(n, "unknown") for n in attempt.nodes}
            if node_health is not None and all(h != "unknown" for h in health.values()):
                dead = tuple(n for n, h in health.items() if h == "dead")
                if dead:
                    why.append("confirmed dead by b300d's checks: " + ", ".join(dead))
                    return verdict(Outcome.INFRA, True, suspects=dead)
                if "undecided" not in health.values() and waited >= detect_window_s:
                    why.append("infrastructure errors in the log; b300d's checks found every node "
                               "alive (no node to drain)")
                    return verdict(Outcome.INFRA, True, implicated=attempt.nodes)
                if waited < settle_s:
                    checking = [n for n, h in health.items() if h == "undecided"] or list(health)
                    why.append("infrastructure errors in the log; b300d is checking "
                               + ", ".join(checking))
                    return verdict(Outcome.INFRA, True, wait=True)
            if waited < settle_s:
                why.append(f"infrastructure errors in the log; waiting up to {settle_s:.0f} s "
                           "for Slurm to show the failed node")
                return verdict(Outcome.INFRA, True, wait=True)
            why.append("infrastructure errors in the log, no node marked bad by Slurm")
            return verdict(Outcome.INFRA, True, implicated=attempt.nodes)
        if attempt.exit_code is not None and attempt.exit_code in spec.retries.retryable_exit_codes:
            why.append("exit code marked retryable in the spec")
            return verdict(Outcome.RETRYABLE_EXIT, True)
        return verdict(Outcome.JOB_ERROR, False)
    # DEADLINE, OUT_OF_MEMORY and anything else the job brought on itself.
    return verdict(Outcome.JOB_ERROR, False)


@dataclass(frozen=True, slots=True)
class BlackHolePolicy:
    """Drain a node that failed ``failures`` different runs within ``window_s``."""

    failures: int = 3
    window_s: float = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class NodeStrikes:
    node: str
    runs: tuple[str, ...] = field(default_factory=tuple)


#: Strike outcomes that count toward the black-hole rule: failures classified as
#: infrastructure (and Slurm's own requeue after a node failure). A hang, a job
#: error or a cancel says nothing about the node.
BLACK_HOLE_OUTCOMES = frozenset({Outcome.INFRA.value, "REQUEUED"})


def last_returns(events: Iterable[Event]) -> dict[str, datetime]:
    """When each node last returned to service: an operator's ``b300ctl nodes resume``
    (``node.resumed``) or a change seen in sinfo from a bad state to a good one
    (``node.state``; e.g. ``scontrol update state=resume``, or slurmd back up)."""
    back: dict[str, datetime] = {}
    for e in events:
        if not e.node:
            continue
        if e.kind == Kind.NODE_RESUMED or (
            e.kind == Kind.NODE_STATE and (s := NodeState.of(e)).old_state is not None
            and _bad(s.old_state or "", s.old_reason or "")
            and not _bad(s.state, s.reason)
        ):
            back[e.node] = max(back.get(e.node, e.ts), e.ts)
    return back


def black_holes(
    strikes: Iterable[Event], policy: BlackHolePolicy, now: datetime,
    returned: Mapping[str, datetime] | None = None,
) -> list[NodeStrikes]:
    """Nodes whose infrastructure strikes (``node.failed``/``node.suspect`` with an
    outcome in :data:`BLACK_HOLE_OUTCOMES`) in the window, and since the node last
    returned to service (``returned``), come from at least ``policy.failures``
    different runs."""
    since = now - timedelta(seconds=policy.window_s)
    back = returned or {}
    by_node: dict[str, set[str]] = {}
    for e in strikes:
        if (not e.node or e.ts < since or e.kind not in (Kind.NODE_FAILED, Kind.NODE_SUSPECT)
                or NodeStrike.of(e).outcome not in BLACK_HOLE_OUTCOMES):
            continue
        if e.node in back and e.ts <= back[e.node]:
            continue
        by_node.setdefault(e.node, set()).add(e.run_id or f"event-{e.id}")
    return [NodeStrikes(node, tuple(sorted(runs))) for node, runs in sorted(by_node.items())
            if len(runs) >= policy.failures]


def retries_used(attempts: Sequence[Attempt]) -> tuple[int, int]:
    """(infrastructure retries, preemption retries) already spent by these attempts."""
    infra = sum(1 for a in attempts if a.outcome in {o.value for o in INFRA_BUDGET})
    preempt = sum(1 for a in attempts if a.outcome == Outcome.PREEMPTED.value)
    return infra, preempt
