"""Which checkpoints to keep and which to delete: a pure plan over plain records.

The rules (like restic's ``forget`` and Orbax's keep-per-interval): keep the
newest ``keep_last`` complete checkpoints, the newest of each UTC hour for
``hourly_for`` and of each UTC day for ``daily_for`` back from ``now``, and every
marked one. Whatever the rules say, the plan NEVER deletes:

- the newest verified checkpoint (and deletes nothing at all while none is
  verified: there would be nothing safe to prune against);
- a checkpoint a pending resume points at;
- a complete checkpoint not yet replicated to every configured target;
- an incomplete checkpoint newer than the newest complete one (it may be
  being written right now).

Incomplete checkpoints older than the newest complete one are leftovers of a
crash and go. The same plan prunes remote copies (no replication targets there).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..model import CheckpointInfo


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    keep_last: int = 3
    hourly_for: timedelta = timedelta(0)
    daily_for: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError("keep_last must be at least 1")


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """A checkpoint with what the daemon knows about it beyond the layout's listing."""

    info: CheckpointInfo
    verified: bool = False
    marked: bool = False
    replicated_to: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """``keep`` maps each kept path to why; ``delete`` lists the rest, oldest first."""

    keep: dict[str, tuple[str, ...]] = field(default_factory=dict)
    delete: tuple[CheckpointInfo, ...] = ()


def plan_prune(
    checkpoints: Iterable[CheckpointState],
    policy: RetentionPolicy,
    now: datetime,
    *,
    pending_resume: Collection[str] = (),
    replication_targets: Collection[str] = (),
) -> PrunePlan:
    """What the next prune keeps (with reasons) and deletes; see the module's rules."""
    states = sorted(checkpoints, key=lambda s: (s.info.step, s.info.mtime, s.info.path))
    reasons: dict[str, list[str]] = {s.info.path: [] for s in states}

    def keep(state: CheckpointState, why: str) -> None:
        reasons[state.info.path].append(why)

    complete = [s for s in states if s.info.complete]
    verified = [s for s in complete if s.verified]
    newest_complete_step = complete[-1].info.step if complete else None
    targets = frozenset(replication_targets)

    for s in complete[-policy.keep_last:]:
        keep(s, f"newest {policy.keep_last}")
    _keep_per_bucket(complete, now, policy.hourly_for, timedelta(hours=1), "hourly", keep)
    _keep_per_bucket(complete, now, policy.daily_for, timedelta(days=1), "daily", keep)
    if verified:
        keep(verified[-1], "newest verified")
    for s in states:
        if s.marked:
            keep(s, "marked")
        if s.info.path in pending_resume:
            keep(s, "pending resume")
        if targets and s.info.complete and not targets <= s.replicated_to:
            keep(s, "not replicated to " + ",".join(sorted(targets - s.replicated_to)))
        if not s.info.complete and (newest_complete_step is None or s.info.step > newest_complete_step):
            keep(s, "may be being written")
        if not verified:
            keep(s, "no verified checkpoint to prune against")
    kept = {path: tuple(why) for path, why in reasons.items() if why}
    delete = tuple(s.info for s in states if s.info.path not in kept)
    return PrunePlan(keep=kept, delete=delete)


def _keep_per_bucket(
    complete: list[CheckpointState],
    now: datetime,
    span: timedelta,
    width: timedelta,
    label: str,
    keep: Callable[[CheckpointState, str], None],
) -> None:
    if span <= timedelta(0):
        return
    seen: set[int] = set()
    for s in reversed(complete):  # newest first: the newest of each bucket wins
        age = now - s.info.mtime
        if age > span:
            continue
        bucket = int(s.info.mtime.timestamp() // width.total_seconds())
        if bucket not in seen:
            seen.add(bucket)
            keep(s, label)


def requested_policy(configured: RetentionPolicy, *, keep_last: object = None,
                     keep_hourly_for: object = None, keep_daily_for: object = None) -> RetentionPolicy:
    """``configured`` with a person's overrides (``b300ctl checkpoints --keep-*``; None keeps
    the configured value). The same check on both sides of the control socket: b300ctl
    before it asks, the daemon on what it is asked. Raises UsageError naming the option."""
    from ..errors import UsageError
    from ..grammar.duration import parse_span

    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                  or keep_last < 1):
        raise UsageError("--keep-last must be at least 1")

    def span(value: object, option: str, default: timedelta) -> timedelta:
        if value is None:
            return default
        if not isinstance(value, str):
            raise UsageError(f"{option} must be a duration such as 7d")
        return parse_span(value.strip(), option, "checkpoints", UsageError)

    return RetentionPolicy(
        keep_last=configured.keep_last if keep_last is None else keep_last,
        hourly_for=span(keep_hourly_for, "--keep-hourly-for", configured.hourly_for),
        daily_for=span(keep_daily_for, "--keep-daily-for", configured.daily_for),
    )
