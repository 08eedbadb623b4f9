"""Whether to restart a run at all: the restart-loop breaker and "do not restart" exits.

Both are pure functions over what the daemon has recorded; recovery asks them after
classifying an ended attempt and before resubmitting.

The loop breaker (NVIDIA Megatron-LM issue 5281: 44 identical restart cycles, each
dying before its first checkpoint): a run whose last ``attempts`` ended attempts in a
row did not advance its newest checkpoint step makes no progress by restarting; stop
it and say why. Preemptions neither count nor break the row (the scheduler's doing),
unless they advanced the checkpoint, which always resets it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .findings import Finding, FindingKind
from .protocol import ExitIntent
from .thresholds import RestartLoopThresholds


@dataclass(frozen=True, slots=True)
class AttemptCheckpoints:
    """One ended attempt: its number, its outcome (``Outcome`` value or Slurm state) and the
    newest complete checkpoint step of the run when it ended (None: no checkpoint yet)."""

    number: int
    outcome: str
    newest_step: int | None


@dataclass(frozen=True, slots=True)
class RestartLoopDecision:
    """``stop``: do not resubmit. ``attempts``: the attempts in the row without progress."""

    stop: bool
    reason: str
    attempts: tuple[int, ...] = ()
    newest_step: int | None = None

    def finding(self, run: str, at: datetime) -> Finding | None:
        if not self.stop:
            return None
        return Finding(kind=FindingKind.RESTART_LOOP, run=run, at=at, evidence=self.reason,
                       value=float(len(self.attempts)), step=self.newest_step)


def restart_loop_decision(attempts: Sequence[AttemptCheckpoints], thresholds: RestartLoopThresholds,
                          *, start_step: int | None = None) -> RestartLoopDecision:
    """Decide over the run's ended attempts (in order). ``start_step``: the checkpoint step
    the run was first started from (None: from scratch)."""
    newest = start_step
    row: list[int] = []
    for attempt in sorted(attempts, key=lambda a: a.number):
        if attempt.newest_step is not None and (newest is None or attempt.newest_step > newest):
            newest = attempt.newest_step
            row = []
        elif attempt.outcome not in thresholds.ignore_outcomes:
            row.append(attempt.number)
    if len(row) < thresholds.attempts:
        return RestartLoopDecision(False, f"{len(row)} attempt(s) in a row without progress "
                                          f"(limit {thresholds.attempts})", tuple(row), newest)
    since = f"newer than step {newest}" if newest is not None else "at all"
    names = ", ".join(map(str, row[-thresholds.attempts:]))
    return RestartLoopDecision(
        True, f"restart loop: the last {len(row)} attempts ({names}) ended without a checkpoint "
              f"{since}; resubmitting again would repeat them", tuple(row), newest)


class ExitVerdict(enum.StrEnum):
    NO_RESTART = "no_restart"
    RESTART_REQUESTED = "restart_requested"
    UNDECLARED = "undeclared"


@dataclass(frozen=True, slots=True)
class ExitClassification:
    verdict: ExitVerdict
    reason: str

    def finding(self, run: str, at: datetime) -> Finding | None:
        if self.verdict is not ExitVerdict.NO_RESTART:
            return None
        return Finding(kind=FindingKind.NO_RESTART, run=run, at=at, evidence=self.reason)


def classify_exit(exit_code: int | None, *, no_restart_exit_codes: Sequence[int],
                  intent: ExitIntent | None) -> ExitClassification:
    """What the spec and the job said about restarting after this exit.

    ``exit_code``: the job's exit code (None: unknown, e.g. killed by a signal);
    ``intent``: the last ``exit_intent`` the ending attempt wrote. Any "do not restart"
    wins over a "restart": a needless stop costs a person a look, a needless restart
    loop costs GPU hours. An exit code 0 declares nothing (the job finished)."""
    if exit_code is not None and exit_code != 0 and exit_code in no_restart_exit_codes:
        return ExitClassification(ExitVerdict.NO_RESTART,
                                  f"exit code {exit_code} is declared not to be restarted "
                                  f"(no_restart_exit_codes)")
    if intent is not None and not intent.restart:
        why = f": {intent.why}" if intent.why else ""
        return ExitClassification(ExitVerdict.NO_RESTART, f"the job asked not to be restarted{why}")
    if intent is not None and intent.restart:
        why = f": {intent.why}" if intent.why else ""
        return ExitClassification(ExitVerdict.RESTART_REQUESTED, f"the job asked to be restarted{why}")
    return ExitClassification(ExitVerdict.UNDECLARED, "nothing declared about restarting")
