"""The liveness state machine, per node (pure: no I/O, no clock; ``now`` is passed in).

    OK --miss--> MISSING(k) --k reaches N--> SUSPECT --confirmation failed and
    silent for the window--> DEAD
    SUSPECT --primary answers--> OK (CLEARED)
    SUSPECT --confirmation answers--> SPLIT (CLEARED): the node is alive, only the
        primary path is silent (e.g. slurmd died and systemd restarts it); confirmed
        again every ``recheck_s`` while the primary stays silent
    SPLIT, DEAD --primary answers--> OK (RECOVERED)

The confirmation is asked one round early, at the (N-1)-th miss in a row, so that
its own time (up to ``confirm_timeout_s`` for a silent node) runs beside the last
primary check instead of after it; what it answers counts only while the primary
stays silent (an answer to the primary forgets it). A node is still dead only after
N + window misses in a row and a failed confirmation.

A round's results name every node checked; a node absent from a round is no
longer a target and is forgotten. ``NOT_CHECKED`` results change nothing.

The state is not persisted: after a daemon restart every node starts at OK.
A dead node is found again within ``N * interval + window`` (it is still dead),
while a miss count carried over a restart would mix silences from before and
after it (the gap in between is not silence). See docs/design/liveness.md.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from .timing import LivenessConfig
from .verdicts import CheckOutcome, CheckResult, ConfirmOutcome, ConfirmResult, Decision, Verdict

_KEEP = 6  # check results kept per node for the evidence text


class Health(enum.StrEnum):
    OK = "ok"
    MISSING = "missing"
    SUSPECT = "suspect"
    SPLIT = "split"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class NodeLiveness:
    """What is known about one node: its state, the misses in a row, the recent evidence."""

    node: str
    health: Health = Health.OK
    misses: int = 0
    suspect_at: datetime | None = None
    suspect_misses: int = 0                   # ``misses`` when it became suspect
    confirm_asked_at: datetime | None = None  # a confirmation was asked for and has not come back
    confirm_failed: str = ""                  # the failed confirmation's text, while SUSPECT
    confirmed_at: datetime | None = None      # the last confirmation's time, while SPLIT
    recent: tuple[str, ...] = ()
    answering: bool = False                   # OK, and every check since the last evidence line answered


@dataclass(frozen=True, slots=True)
class Step:
    """The states after one step, what was decided, and the nodes to confirm now."""

    states: Mapping[str, NodeLiveness]
    decisions: tuple[Decision, ...] = ()
    confirm: tuple[str, ...] = ()
    note: str = ""  # why a round's silences were not counted, if they were not
    uncounted: tuple[str, ...] = ()  # the nodes whose silence was not counted (mass silence)


def observe_checks(states: Mapping[str, NodeLiveness], results: Sequence[CheckResult], now: datetime,
                   config: LivenessConfig) -> Step:
    """Fold one round of primary checks into ``states``."""
    silent = [r for r in results if r.outcome is not _OK and r.outcome in _SILENCE]
    ignore_silence = mass_silence(len(silent), len(results), config)
    note = (f"{len(silent)} of {len(results)} nodes silent in one round: a network partition or the "
            "login node's own trouble, not a node failure; not counted") if ignore_silence else ""
    # A node that answers again while answering keeps its state object as it is: a steady
    # round does no work per node beyond this look-up. Every other result is folded in.
    get = states.get
    kept = [s for r in results if r.outcome is _OK and (s := get(r.node)) is not None and s.answering]
    out = {s.node: s for s in kept}
    if len(kept) == len(results):
        return Step(out)
    decisions: list[Decision] = []
    confirm: list[str] = []
    for r in results:
        s = get(r.node)
        if s is not None and s.answering and r.outcome is _OK:
            continue
        s = s or NodeLiveness(r.node)
        if r.outcome is CheckOutcome.NOT_CHECKED or (ignore_silence and r.outcome in _SILENCE):
            s = _remember(s, now, f"{r.outcome.value if not ignore_silence else 'not counted'}"
                          f"{' (' + r.detail + ')' if r.detail else ''}")
        elif r.outcome.answered:
            s, d = _answered(s, r, now)
            if d is not None:
                decisions.append(d)
        else:
            s, d, ask = _missed(s, r, now, config)
            if d is not None:
                decisions.append(d)
            if ask:
                confirm.append(r.node)
        out[r.node] = s
    return Step(out, tuple(decisions), tuple(confirm), note,
                tuple(sorted(r.node for r in silent)) if ignore_silence else ())


def mass_silence(silent: int, checked: int, config: LivenessConfig) -> bool:
    """Whether ``silent`` of ``checked`` nodes going quiet in one round is one cause (the
    network between the login node and them, or the login node itself) rather than that
    many nodes failing at once: at least two nodes, and at least ``mass_silence_fraction``
    of those checked. Independent node failures (a few per 1,000 node-days) almost never
    land in the same second; a switch, a cut link or the login node's own NIC does."""
    return silent >= 2 and silent >= config.mass_silence_fraction * checked


def observe_confirmations(states: Mapping[str, NodeLiveness], results: Sequence[ConfirmResult],
                          now: datetime, config: LivenessConfig) -> Step:
    """Fold the confirmation checks' answers into ``states`` (answers for nodes that are
    no longer suspect are stale and ignored)."""
    out = dict(states)
    decisions: list[Decision] = []
    for r in results:
        s = out.get(r.node)
        early = s is not None and s.health is Health.MISSING and s.confirm_asked_at is not None
        if s is None or (s.health is not Health.SUSPECT and not early):
            continue
        text = f"confirmation {r.outcome.value} in {_ms(r.latency_s)}{': ' + r.detail if r.detail else ''}"
        s = _remember(replace(s, confirm_asked_at=None), now, text)
        if early:
            # Asked one round before suspect: a failure is kept for the suspect's window; an
            # answer (alive) or no verdict is not, and the confirmation is asked again then.
            if r.outcome is ConfirmOutcome.FAILED:
                s = replace(s, confirm_failed=text)
        elif r.outcome.alive:
            s = replace(s, health=Health.SPLIT, confirmed_at=now, suspect_at=None, confirm_failed="")
            decisions.append(_decide(s, Verdict.CLEARED, now,
                                     "primary check silent but the node answers the confirmation: "
                                     "alive, no action"))
        elif r.outcome is ConfirmOutcome.FAILED:
            s = replace(s, confirm_failed=text)
            if _window_over(s, config):
                s, d = _dead(s, now, config)
                decisions.append(d)
        out[r.node] = s
    return Step(out, tuple(decisions))


_SILENCE = frozenset({CheckOutcome.TIMEOUT, CheckOutcome.UNREACHABLE, CheckOutcome.ERROR})
_OK = CheckOutcome.OK


def _answered(s: NodeLiveness, r: CheckResult, now: datetime) -> tuple[NodeLiveness, Decision | None]:
    was = s.health
    text = f"ok {_ms(r.latency_s)} and each check after"
    if was in (Health.OK, Health.MISSING):  # nothing to decide: the fresh state and its evidence only
        return NodeLiveness(s.node, recent=(*s.recent, f"{_stamp(now)} {text}")[-_KEEP:], answering=True), None
    s = _remember(s, now, text)
    fresh = NodeLiveness(s.node, recent=s.recent, answering=True)
    if was is Health.SUSPECT:
        return fresh, _decide(s, Verdict.CLEARED, now, "answered the primary check within the window")
    if was in (Health.SPLIT, Health.DEAD):
        return fresh, _decide(s, Verdict.RECOVERED, now, f"answers the primary check again (was {was.value})")
    return fresh, None


def _missed(s: NodeLiveness, r: CheckResult, now: datetime,
            config: LivenessConfig) -> tuple[NodeLiveness, Decision | None, bool]:
    s = _remember(replace(s, misses=s.misses + 1), now,
                  f"{r.outcome.value} {_ms(r.latency_s)}{' (' + r.detail + ')' if r.detail else ''}")
    if s.health in (Health.OK, Health.MISSING):
        if s.misses < config.misses_to_suspect:
            s = replace(s, health=Health.MISSING)
            if s.misses == config.misses_to_suspect - 1 and s.confirm_asked_at is None \
                    and not s.confirm_failed:
                # One round early: the confirmation's own time overlaps the last primary miss.
                return replace(s, confirm_asked_at=now), None, True
            return s, None, False
        failed = s.confirm_failed  # the early confirmation's failure, if it came back already
        ask = not failed and s.confirm_asked_at is None
        s = replace(s, health=Health.SUSPECT, suspect_at=now, suspect_misses=s.misses,
                    confirm_asked_at=now if ask else s.confirm_asked_at)
        if failed and _window_over(s, config):  # a window of 0 rounds
            s, d = _dead(s, now, config)
            return s, d, False
        how = "the confirmation failed already" if failed else "confirming"
        return s, _decide(s, Verdict.SUSPECT, now, f"missed {s.misses} primary checks in a row: {how}"), ask
    if s.health is Health.SUSPECT:
        if s.confirm_failed and _window_over(s, config):
            s, d = _dead(s, now, config)
            return s, d, False
        lost = (s.confirm_asked_at is None or
                now - s.confirm_asked_at > timedelta(seconds=config.confirm_timeout_s + config.interval_s))
        if not s.confirm_failed and lost:  # no answer came back for the last request: ask again
            return replace(s, confirm_asked_at=now), None, True
        return s, None, False
    if s.health is Health.SPLIT:
        assert s.confirmed_at is not None
        if now - s.confirmed_at >= timedelta(seconds=config.recheck_s):
            s = replace(s, health=Health.SUSPECT, suspect_at=now, suspect_misses=s.misses,
                        confirm_asked_at=now, confirmed_at=None)
            return s, None, True
        return s, None, False
    return s, None, False  # DEAD stays dead until it answers


def _window_over(s: NodeLiveness, config: LivenessConfig) -> bool:
    """Whether the primary check stayed silent for the whole window since the node became suspect.

    Counted in rounds (``ceil(window / interval)`` more misses), not read off the clock:
    rounds a few milliseconds early must not cut the window by one, and rounds that come
    late (a stalled daemon) only make it longer."""
    return s.misses - s.suspect_misses >= window_rounds(config)


def window_rounds(config: LivenessConfig) -> int:
    """The confirmation window in rounds of the primary check."""
    return math.ceil(config.confirm_window_s / config.interval_s - 1e-9)


def _dead(s: NodeLiveness, now: datetime, config: LivenessConfig) -> tuple[NodeLiveness, Decision]:
    assert s.suspect_at is not None
    silent = (now - s.suspect_at).total_seconds()
    s = replace(s, health=Health.DEAD, confirm_asked_at=None)
    return s, _decide(s, Verdict.DEAD, now,
                      f"missed {s.misses} primary checks in a row, {s.misses - s.suspect_misses} of them "
                      f"in the {silent:.1f} s since it became suspect (window {config.confirm_window_s:g} s); "
                      f"{s.confirm_failed}")


def _decide(s: NodeLiveness, verdict: Verdict, now: datetime, why: str) -> Decision:
    return Decision(s.node, verdict, now, f"{s.node}: {why}; recent: " + "; ".join(s.recent), s.misses)


def _remember(s: NodeLiveness, now: datetime, text: str) -> NodeLiveness:
    return replace(s, recent=(*s.recent, f"{_stamp(now)} {text}")[-_KEEP:], answering=False)


@functools.lru_cache(maxsize=4)
def _stamp(now: datetime) -> str:
    """``now`` as the evidence writes it (to the millisecond): once per round, not per node."""
    return f"{now:%H:%M:%S.%f}"[:-3]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1e6:.0f} us"


def undecided(states: Mapping[str, NodeLiveness], nodes: Sequence[str]) -> tuple[str, ...]:
    """The ``nodes`` that are missing checks or suspect right now: not known alive, not yet
    confirmed dead. Recovery of an attempt that failed with peer/NCCL evidence waits while
    this is not empty (bounded by its settle time) instead of waiting blind for Slurm."""
    return tuple(n for n in nodes if n in states and states[n].health in (Health.MISSING, Health.SUSPECT))


def confirmed_dead(states: Mapping[str, NodeLiveness], nodes: Sequence[str]) -> tuple[str, ...]:
    """The ``nodes`` confirmed dead (the suspects to drain and exclude)."""
    return tuple(n for n in nodes if n in states and states[n].health is Health.DEAD)
