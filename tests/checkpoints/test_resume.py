"""choose_resume: newest complete and verified, falling back to older ones (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from b300.checkpoints.resume import choose_resume
from b300.model import CheckpointInfo

T0 = datetime(2026, 11, 29, tzinfo=UTC)


def _ck(step: int, complete: bool = True) -> CheckpointInfo:
    return CheckpointInfo(path=f"/c/step_{step}", step=step, mtime=T0 + timedelta(minutes=step),
                          complete=complete)


def test_newest_complete_and_verified_wins() -> None:
    cks = [_ck(1), _ck(2), _ck(3, complete=False)]
    assert choose_resume(cks, lambda c: True) == _ck(2)


def test_falls_back_when_the_newest_fails_verification() -> None:
    asked: list[int] = []

    def verified(c: CheckpointInfo) -> bool:
        asked.append(c.step)
        return c.step != 3

    assert choose_resume([_ck(3), _ck(1), _ck(2)], verified) == _ck(2)
    assert asked == [3, 2]  # stops at the first good one, never asks about incomplete ones


def test_nothing_usable_is_none() -> None:
    assert choose_resume([], lambda c: True) is None
    assert choose_resume([_ck(1, complete=False)], lambda c: True) is None
    assert choose_resume([_ck(1)], lambda c: False) is None


@given(st.lists(st.tuples(st.integers(0, 50), st.booleans(), st.booleans()), max_size=30))
def test_choice_is_the_max_over_usable(history: list[tuple[int, bool, bool]]) -> None:
    cks = {(s, c, v): _ck(s, c) for s, c, v in history}
    good = {_ck(s, c) for (s, c, v) in cks if c and v}
    bad = {_ck(s, c) for (s, c, v) in cks if not v}
    chosen = choose_resume(cks.values(), lambda ck: ck in good and ck not in bad)
    usable = [ck for ck in good if ck not in bad]
    if not usable:
        assert chosen is None
    else:
        assert chosen is not None and chosen.step == max(ck.step for ck in usable)
