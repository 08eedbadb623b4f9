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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..model import Attempt, AttemptState, Event, NodeRecord
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


def node_is_bad(node: NodeRecord | None) -> bool:
    if node is None:
        return False
    return node.state.upper() in _BAD_NODE_STATES or "NOT RESPONDING" in node.reason.upper()


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
) -> Verdict:
    """Classify a terminal attempt. Pure: everything it needs is passed in.

    A job that failed within ``signal_grace`` of the daemon's checkpoint signal
    died of it (a batch shell that does not trap USR1 exits): SIGNALLED, the
    daemon's doing, resubmitted, never the job's error."""
    state = attempt.state
    bad = tuple(n for n in attempt.nodes if node_is_bad(nodes_now.get(n)))
    named = tuple(sorted({m.group(1) for line in log_lines for m in _NODE_IN_LOG.finditer(line)
                          if m.group(1) in attempt.nodes}))
    suspects = tuple(sorted(set(bad) | set(named)))
    infra_lines = infra_log_lines(log_lines)
    why = [f"slurm state {state.value}"]
    if attempt.exit_code is not None:
        why.append(f"exit {attempt.exit_code}:{attempt.signal or 0}")
    if bad:
        why.append("nodes now " + ", ".join(
            f"{n} {nodes_now[n].state.lower()} ({nodes_now[n].reason or 'no reason'})" for n in bad))

    def verdict(outcome: Outcome, resubmit: bool, **kw: object) -> Verdict:
        return Verdict(outcome=outcome, resubmit=resubmit, reasons=tuple(why),
                       log_lines=infra_lines, **kw)  # type: ignore[arg-type]

    if state is AttemptState.COMPLETED:
        return verdict(Outcome.COMPLETED, False)
    if state is AttemptState.CANCELLED:
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
        if infra_lines:
            waited = (now - (attempt.end or now)) / timedelta(seconds=1)
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


def black_holes(
    strikes: Iterable[Event], policy: BlackHolePolicy, now: datetime
) -> list[NodeStrikes]:
    """Nodes whose strike events (``node.failed``/``node.suspect``) in the window
    come from at least ``policy.failures`` different runs."""
    since = now - timedelta(seconds=policy.window_s)
    by_node: dict[str, set[str]] = {}
    for e in strikes:
        if e.node and e.ts >= since and e.kind in ("node.failed", "node.suspect"):
            by_node.setdefault(e.node, set()).add(e.run_id or f"event-{e.id}")
    return [NodeStrikes(node, tuple(sorted(runs))) for node, runs in sorted(by_node.items())
            if len(runs) >= policy.failures]


def retries_used(attempts: Sequence[Attempt]) -> tuple[int, int]:
    """(infrastructure retries, preemption retries) already spent by these attempts."""
    infra = sum(1 for a in attempts if a.outcome in {o.value for o in INFRA_BUDGET})
    preempt = sum(1 for a in attempts if a.outcome == Outcome.PREEMPTED.value)
    return infra, preempt
