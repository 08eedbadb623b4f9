"""The liveness state machine (pure): thresholds, the window, clearing, mass silence."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.liveness.machine import Health, NodeLiveness, Step, observe_checks, observe_confirmations
from b300.liveness.timing import LivenessConfig
from b300.liveness.verdicts import (
    CheckOutcome,
    CheckResult,
    ConfirmOutcome,
    ConfirmResult,
    Verdict,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CFG = LivenessConfig()  # interval 1 s, N 3, window 1 s
OK, REFUSED, TIMEOUT = CheckOutcome.OK, CheckOutcome.REFUSED, CheckOutcome.TIMEOUT


def _round(states: dict[str, NodeLiveness] | None, i: int, **outcomes: CheckOutcome) -> Step:
    results = [CheckResult(node, o, 0.001, "x") for node, o in outcomes.items()]
    return observe_checks(states or {}, results, T0 + timedelta(seconds=i), CFG)


def _confirm(states: dict[str, NodeLiveness] | dict, i: float, node: str,
             outcome: ConfirmOutcome) -> Step:
    return observe_confirmations(states, [ConfirmResult(node, outcome, 0.01, "ssh")],
                                 T0 + timedelta(seconds=i), CFG)


def _verdicts(step: Step) -> list[tuple[str, Verdict]]:
    return [(d.node, d.verdict) for d in step.decisions]


def test_dead_after_n_misses_a_failed_confirmation_and_the_window() -> None:
    s = _round(None, 0, a=OK, b=OK)
    s = _round(dict(s.states), 1, a=REFUSED, b=OK)
    s = _round(dict(s.states), 2, a=REFUSED, b=OK)
    assert s.decisions == () and s.states["a"].health is Health.MISSING
    assert s.confirm == ("a",)  # asked one round before suspect
    s = _round(dict(s.states), 3, a=REFUSED, b=OK)
    assert _verdicts(s) == [("a", Verdict.SUSPECT)] and s.confirm == ()  # asked already
    c = _confirm(dict(s.states), 3.05, "a", ConfirmOutcome.FAILED)
    assert c.decisions == ()  # the window (one round) is not over yet
    s = _round(dict(c.states), 4, a=REFUSED, b=OK)
    assert _verdicts(s) == [("a", Verdict.DEAD)]
    dead = s.decisions[0]
    assert "missed 4 primary checks" in dead.evidence and "confirmation failed" in dead.evidence
    assert "12:00:01.000 refused" in dead.evidence and dead.misses == 4
    s = _round(dict(s.states), 5, a=REFUSED, b=OK)
    assert s.decisions == ()  # dead is said once
    s = _round(dict(s.states), 6, a=OK, b=OK)
    assert _verdicts(s) == [("a", Verdict.RECOVERED)] and s.states["a"].health is Health.OK


def test_confirmation_answering_clears_and_rechecks_later() -> None:
    s = _round(None, 0, a=TIMEOUT, b=OK)
    s = _round(dict(s.states), 1, a=TIMEOUT, b=OK)
    assert s.confirm == ("a",)
    s = _round(dict(s.states), 2, a=TIMEOUT, b=OK)
    c = _confirm(dict(s.states), 2.5, "a", ConfirmOutcome.ANSWERED)
    assert _verdicts(c) == [("a", Verdict.CLEARED)] and c.states["a"].health is Health.SPLIT
    states = dict(c.states)
    asked = []
    for i in range(3, 3 + 40):
        s = _round(states, i, a=TIMEOUT, b=OK)
        states = dict(s.states)
        assert Verdict.DEAD not in [v for _, v in _verdicts(s)]
        asked += [i] * len(s.confirm)
    assert asked and asked[0] == 33  # recheck_s 30 after the confirmation at 2.5 s


def test_primary_answer_within_the_window_clears_even_after_failed_confirmation() -> None:
    s = _round(None, 0, a=TIMEOUT)
    s = _round(dict(s.states), 1, a=TIMEOUT)
    s = _round(dict(s.states), 2, a=TIMEOUT)
    c = _confirm(dict(s.states), 2.5, "a", ConfirmOutcome.FAILED)
    s = _round(dict(c.states), 3, a=OK)
    assert _verdicts(s) == [("a", Verdict.CLEARED)] and s.states["a"].health is Health.OK


def test_not_checked_is_no_evidence_either_way() -> None:
    s = _round(None, 0, a=REFUSED)
    s = _round(dict(s.states), 1, a=CheckOutcome.NOT_CHECKED)
    assert s.states["a"].misses == 1
    s = _round(dict(s.states), 2, a=REFUSED)
    assert s.states["a"].misses == 2


def test_a_round_where_most_nodes_go_silent_is_not_counted() -> None:
    s = _round(None, 0, a=TIMEOUT, b=TIMEOUT, c=OK)
    assert "2 of 3 nodes silent" in s.note and all(st_.misses == 0 for st_ in s.states.values())
    s = _round(None, 0, a=REFUSED, b=REFUSED, c=OK)  # resets come from the nodes' kernels: counted
    assert s.states["a"].misses == 1 and s.note == ""
    s = _round(None, 0, a=TIMEOUT, b=OK)  # one node alone is never "mass silence"
    assert s.states["a"].misses == 1 and s.uncounted == ()


def test_half_the_nodes_silent_is_a_partition_kept_for_as_long_as_it_lasts() -> None:
    """2 of 4 silent (a switch, a cut link) is at the fraction (0.5): reported, never dead;
    1 of 4 is one node's failure and counted as before."""
    states: dict[str, NodeLiveness] = {}
    for i in range(12):
        s = _round(states, i, a=OK, b=OK, c=TIMEOUT, d=TIMEOUT)
        states = dict(s.states)
        assert s.uncounted == ("c", "d") and not s.decisions
    assert all(st_.health is Health.OK for st_ in states.values())
    s = _round(None, 0, a=OK, b=OK, c=OK, d=TIMEOUT)
    assert s.uncounted == () and s.states["d"].misses == 1
    assert "network partition" in _round(None, 0, a=OK, b=OK, c=TIMEOUT, d=TIMEOUT).note


def test_a_node_leaving_the_targets_is_forgotten() -> None:
    s = _round(None, 0, a=REFUSED, b=OK)
    s = _round(dict(s.states), 1, b=OK)
    assert set(s.states) == {"b"}


def test_stale_confirmation_is_ignored() -> None:
    s = _round(None, 0, a=OK)
    c = _confirm(dict(s.states), 0.5, "a", ConfirmOutcome.FAILED)
    assert c.decisions == () and c.states["a"].health is Health.OK
    c = _confirm({}, 0.5, "ghost", ConfirmOutcome.FAILED)
    assert c.decisions == () and "ghost" not in c.states


def test_lost_confirmation_is_asked_again() -> None:
    s = _round(None, 0, a=REFUSED)
    s = _round(dict(s.states), 1, a=REFUSED)
    assert s.confirm == ("a",)  # at the second miss: one round before suspect
    s = _round(dict(s.states), 2, a=REFUSED)
    assert s.confirm == ()
    states = dict(s.states)
    again = []
    for i in range(3, 8):  # no answer ever comes back
        s = _round(states, i, a=REFUSED)
        states = dict(s.states)
        again += [i] * len(s.confirm)
        assert s.decisions == ()  # never dead without a failed confirmation
    assert again and again[0] == 4  # confirm_timeout_s + interval_s after the ask at 1 s


# -- properties -------------------------------------------------------------

_outcomes = st.sampled_from([OK, REFUSED, TIMEOUT, CheckOutcome.UNREACHABLE, CheckOutcome.NOT_CHECKED])
_confirms = st.sampled_from([None, ConfirmOutcome.FAILED, ConfirmOutcome.ANSWERED,
                             ConfirmOutcome.ANSWERED_REFUSED, ConfirmOutcome.NOT_CHECKED])
_configs = st.builds(
    lambda n, w: LivenessConfig(misses_to_suspect=n, confirm_window_s=float(w)),
    st.integers(1, 5), st.integers(0, 4))


def _run(config: LivenessConfig, seq: list[CheckOutcome], confirms: list[ConfirmOutcome | None],
         ) -> tuple[list[Verdict], list[int]]:
    """Drive one node (plus one healthy neighbour, so a lone miss is never mass silence)."""
    states: dict[str, NodeLiveness] = {}
    verdicts: list[Verdict] = []
    dead_at: list[int] = []
    for i, outcome in enumerate(seq):
        now = T0 + timedelta(seconds=i * config.interval_s)
        s = observe_checks(states, [CheckResult("a", outcome, 0.0), CheckResult("b", OK, 0.0)], now, config)
        states = dict(s.states)
        verdicts += [d.verdict for d in s.decisions]
        dead_at += [i for d in s.decisions if d.verdict is Verdict.DEAD]
        c = confirms[i % len(confirms)]
        if c is not None and (states["a"].health is Health.SUSPECT or
                              states["a"].confirm_asked_at is not None):
            s = observe_confirmations(states, [ConfirmResult("a", c, 0.01)],
                                      now + timedelta(seconds=0.1), config)
            states = dict(s.states)
            verdicts += [d.verdict for d in s.decisions]
            dead_at += [i for d in s.decisions if d.verdict is Verdict.DEAD]
    return verdicts, dead_at


def _longest_miss_run(seq: list[CheckOutcome]) -> int:
    best = run = 0
    for o in seq:
        if o is OK:
            run = 0
        elif o is not CheckOutcome.NOT_CHECKED:
            run += 1
            best = max(best, run)
    return best


@settings(max_examples=400, deadline=None)
@given(_configs, st.lists(_outcomes, max_size=40), st.lists(_confirms, min_size=1, max_size=5))
def test_never_dead_unless_misses_reach_n_in_a_row(config: LivenessConfig, seq: list[CheckOutcome],
                                                    confirms: list[ConfirmOutcome | None]) -> None:
    verdicts, _ = _run(config, seq, confirms)
    if _longest_miss_run(seq) < config.misses_to_suspect:
        assert Verdict.SUSPECT not in verdicts and Verdict.DEAD not in verdicts


@settings(max_examples=400, deadline=None)
@given(_configs, st.lists(_outcomes, max_size=40))
def test_a_node_that_answers_the_confirmation_is_never_confirmed(config: LivenessConfig,
                                                                 seq: list[CheckOutcome]) -> None:
    verdicts, _ = _run(config, seq, [ConfirmOutcome.ANSWERED])
    assert Verdict.DEAD not in verdicts


@settings(max_examples=400, deadline=None)
@given(_configs, st.lists(_outcomes, max_size=40), st.lists(_confirms, min_size=1, max_size=5))
def test_dead_only_after_n_plus_window_misses_in_a_row(config: LivenessConfig, seq: list[CheckOutcome],
                                                       confirms: list[ConfirmOutcome | None]) -> None:
    """A node is confirmed only when the primary missed N + window rounds with no answer
    in between (an answer anywhere in the window clears it)."""
    from b300.liveness.machine import window_rounds
    _, dead_at = _run(config, seq, confirms)
    for i in dead_at:
        run = 0
        for o in reversed(seq[: i + 1]):
            if o is OK:
                break
            run += o is not CheckOutcome.NOT_CHECKED
        assert run >= config.misses_to_suspect + window_rounds(config)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(0, 4))
def test_a_dead_node_is_found_within_n_plus_window_rounds(n: int, w: int) -> None:
    config = LivenessConfig(misses_to_suspect=n, confirm_window_s=float(w))
    _, dead_at = _run(config, [REFUSED] * 20, [ConfirmOutcome.FAILED])
    # Suspect at the n-th miss (round n-1); the failed confirmation comes back at once;
    # dead once w more rounds missed (at once when the window is 0).
    assert dead_at == [n - 1 + w]


def test_an_early_failed_confirmation_makes_the_suspect_dead_after_the_window() -> None:
    s = _round(None, 0, a=REFUSED, b=OK)
    s = _round(dict(s.states), 1, a=REFUSED, b=OK)
    assert s.confirm == ("a",) and s.decisions == ()
    c = _confirm(dict(s.states), 1.9, "a", ConfirmOutcome.FAILED)
    assert c.decisions == () and c.states["a"].health is Health.MISSING
    s = _round(dict(c.states), 2, a=REFUSED, b=OK)
    assert _verdicts(s) == [("a", Verdict.SUSPECT)] and s.confirm == ()
    assert "the confirmation failed already" in s.decisions[0].evidence
    s = _round(dict(s.states), 3, a=REFUSED, b=OK)  # the window: one more round of silence
    assert _verdicts(s) == [("a", Verdict.DEAD)] and s.decisions[0].misses == 4
    assert "confirmation failed in 10 ms" in s.decisions[0].evidence


def test_an_early_confirmation_is_forgotten_when_the_primary_answers() -> None:
    s = _round(None, 0, a=TIMEOUT, b=OK)
    s = _round(dict(s.states), 1, a=TIMEOUT, b=OK)
    c = _confirm(dict(s.states), 1.5, "a", ConfirmOutcome.FAILED)
    s = _round(dict(c.states), 2, a=OK, b=OK)  # a 2 s silence: never suspect
    assert s.decisions == () and s.states["a"].health is Health.OK and not s.states["a"].confirm_failed
    states = dict(s.states)
    for i in range(3, 6):  # a new silence: the old failure does not count for it
        s = _round(states, i, a=TIMEOUT, b=OK)
        states = dict(s.states)
    assert _verdicts(s) == [("a", Verdict.SUSPECT)] and "confirming" in s.decisions[0].evidence
    s = _round(states, 6, a=TIMEOUT, b=OK)
    assert s.decisions == ()  # no failed confirmation for this silence yet: not dead


def test_an_early_alive_answer_is_asked_again_at_suspect() -> None:
    s = _round(None, 0, a=TIMEOUT, b=OK)
    s = _round(dict(s.states), 1, a=TIMEOUT, b=OK)
    c = _confirm(dict(s.states), 1.5, "a", ConfirmOutcome.ANSWERED)
    assert c.decisions == () and c.states["a"].health is Health.MISSING
    s = _round(dict(c.states), 2, a=TIMEOUT, b=OK)
    assert _verdicts(s) == [("a", Verdict.SUSPECT)] and s.confirm == ("a",)
    c = _confirm(dict(s.states), 2.5, "a", ConfirmOutcome.ANSWERED)
    assert _verdicts(c) == [("a", Verdict.CLEARED)] and c.states["a"].health is Health.SPLIT


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 5), st.integers(1, 4))
def test_a_slow_confirmation_does_not_delay_the_verdict(n: int, w: int) -> None:
    """A silent node's confirmation takes its whole timeout (1.5 rounds at the defaults):
    asked one round early, its failure is back before the window ends, so the node is
    still dead at the (N + window)-th miss, as when the confirmation answers at once."""
    config = LivenessConfig(misses_to_suspect=n, confirm_window_s=float(w))
    states: dict[str, NodeLiveness] = {}
    due: dict[int, list[str]] = {}
    dead_at: list[int] = []
    for i in range(20):
        now = T0 + timedelta(seconds=i)
        for node in due.pop(i, []):  # the monitor folds answers in at the start of a round
            c = observe_confirmations(states, [ConfirmResult(node, ConfirmOutcome.FAILED, 1.5)], now, config)
            states = dict(c.states)
            dead_at += [i for d in c.decisions if d.verdict is Verdict.DEAD]
        s = observe_checks(states, [CheckResult("a", TIMEOUT, 0.8), CheckResult("b", OK, 0.0)], now, config)
        states = dict(s.states)
        dead_at += [i for d in s.decisions if d.verdict is Verdict.DEAD]
        for node in s.confirm:
            due.setdefault(i + 2, []).append(node)  # asked at i, failed at i + 1.5
    assert dead_at == [n - 1 + w]


def test_undecided_and_confirmed_dead_for_recovery() -> None:
    from b300.liveness.machine import confirmed_dead, undecided
    s = _round(None, 0, a=REFUSED, b=OK, c=REFUSED)
    s = _round(dict(s.states), 1, a=REFUSED, b=OK, c=OK)
    s = _round(dict(s.states), 2, a=REFUSED, b=OK)
    assert undecided(s.states, ["a", "b", "c"]) == ("a",)  # c is no target any more
    c = _confirm(dict(s.states), 2.5, "a", ConfirmOutcome.FAILED)
    s = _round(dict(c.states), 3, a=REFUSED, b=OK)
    assert confirmed_dead(s.states, ["a", "b"]) == ("a",) and undecided(s.states, ["a", "b"]) == ()


def test_something_answering_but_refusing_us_is_alive() -> None:
    s = _round(None, 0, a=REFUSED, b=OK)
    s = _round(dict(s.states), 1, a=REFUSED, b=OK)
    s = _round(dict(s.states), 2, a=REFUSED, b=OK)
    c = _confirm(dict(s.states), 2.5, "a", ConfirmOutcome.ANSWERED_REFUSED)
    assert _verdicts(c) == [("a", Verdict.CLEARED)] and c.states["a"].health is Health.SPLIT


def test_an_answering_node_keeps_the_last_six_changes_as_evidence() -> None:
    """The answer of a node that was OK or missing checks: a fresh state (no misses) whose
    evidence is its last six changes, each with its round's time to the millisecond. An
    answer after an answer changes nothing: the state object is kept as it is, and the
    evidence line of the first answer stands for the answers after it."""
    states: dict[str, NodeLiveness] = {}
    kept = []
    for i in range(12):
        now = T0 + timedelta(seconds=i, microseconds=123456)
        outcome = TIMEOUT if i in (5, 8, 10) else OK
        before = states.get("a")
        states = dict(observe_checks(states, [CheckResult("a", outcome, 0.0004 * (i + 1))], now, CFG).states)
        kept.append(states["a"] is before)
    s = states["a"]
    assert (s.health, s.misses, s.answering) == (Health.OK, 0, True)
    assert kept == [False, True, True, True, True, False, False, True, False, False, False, False]
    assert s.recent == ("12:00:05.123 timeout 2 ms", "12:00:06.123 ok 3 ms and each check after",
                        "12:00:08.123 timeout 4 ms", "12:00:09.123 ok 4 ms and each check after",
                        "12:00:10.123 timeout 4 ms", "12:00:11.123 ok 5 ms and each check after")
    assert s == NodeLiveness("a", recent=s.recent, answering=True)


def test_a_steady_round_keeps_every_state_and_drops_the_nodes_no_longer_checked() -> None:
    s = _round(None, 0, a=OK, b=OK, c=OK)
    first = dict(s.states)
    s = _round(dict(s.states), 1, a=OK, b=OK)
    assert set(s.states) == {"a", "b"} and all(s.states[n] is first[n] for n in "ab")
    assert s.decisions == () and s.confirm == () and s.note == ""
    s = _round(dict(s.states), 2, a=CheckOutcome.NOT_CHECKED, b=OK)
    assert not s.states["a"].answering and s.states["b"] is first["b"]
    s = _round(dict(s.states), 3, a=OK, b=OK)  # an answer after "not checked" is a change
    assert s.states["a"].answering and s.states["a"].recent[-1] == "12:00:03.000 ok 1 ms and each check after"
