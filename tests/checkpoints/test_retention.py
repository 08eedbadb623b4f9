"""Retention plans: examples, and hypothesis over random histories for what must be kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.checkpoints.retention import CheckpointState, PrunePlan, RetentionPolicy, plan_prune
from b300.model import CheckpointInfo

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _st(step: int, *, age_h: float | None = None, complete: bool = True, verified: bool = True,
        marked: bool = False, replicated: frozenset[str] = frozenset()) -> CheckpointState:
    age = timedelta(hours=age_h if age_h is not None else 1000 - step)
    info = CheckpointInfo(path=f"/c/step_{step}", step=step, mtime=NOW - age, complete=complete)
    return CheckpointState(info, verified=verified, marked=marked, replicated_to=replicated)


def _deleted(plan: PrunePlan) -> list[int]:
    return [c.step for c in plan.delete]




def test_keep_last_hourly_daily_and_marked() -> None:
    history = [_st(s, age_h=50 - s) for s in range(1, 50)]
    plan = plan_prune(history, RetentionPolicy(keep_last=2, hourly_for=timedelta(hours=5),
                                               daily_for=timedelta(days=3)), NOW)
    kept = {int(p.rsplit("_", 1)[1]) for p in plan.keep}
    # newest 2 (48, 49), one per hour for 5 h (45..49), one per day for 3 days.
    assert {45, 46, 47, 48, 49} <= kept
    assert len(kept) <= 5 + 4
    assert 1 not in kept


def test_never_deletes_newest_verified_pending_unreplicated_or_in_progress() -> None:
    history = [
        _st(1, replicated=frozenset({"s3"})),
        _st(2, replicated=frozenset({"s3"})),  # pending resume
        _st(3),  # verified but not replicated
        _st(4, verified=False, replicated=frozenset({"s3"})),
        _st(5, complete=False),  # being written
    ]
    plan = plan_prune(history, RetentionPolicy(keep_last=1), NOW,
                      pending_resume={"/c/step_2"}, replication_targets={"s3"})
    assert _deleted(plan) == [1]
    assert plan.keep["/c/step_2"] == ("pending resume",)
    assert "newest verified" in plan.keep["/c/step_3"]
    assert "not replicated to s3" in plan.keep["/c/step_3"]
    assert plan.keep["/c/step_5"] == ("may be being written",)  # incomplete: never copied


def test_nothing_goes_while_nothing_is_verified() -> None:
    plan = plan_prune([_st(s, verified=False) for s in range(10)], RetentionPolicy(keep_last=1), NOW)
    assert plan.delete == ()


def test_old_incomplete_leftovers_go() -> None:
    plan = plan_prune([_st(1, complete=False), _st(2), _st(3)], RetentionPolicy(keep_last=2), NOW)
    assert _deleted(plan) == [1]


_histories = st.lists(
    st.builds(
        lambda step, age, complete, verified, marked, reps: _st(
            step, age_h=age, complete=complete, verified=verified and complete, marked=marked,
            replicated=frozenset(reps)),
        st.integers(0, 10_000), st.floats(0, 24 * 40), st.booleans(), st.booleans(),
        st.booleans(),
        st.sets(st.sampled_from(["fs", "s3"])),
    ),
    max_size=40,
    unique_by=lambda s: s.info.path,
)


@settings(max_examples=300, deadline=None)
@given(
    history=_histories,
    keep_last=st.integers(1, 5),
    hourly=st.integers(0, 48),
    daily=st.integers(0, 30),
    targets=st.sets(st.sampled_from(["fs", "s3"])),
    pending=st.sets(st.integers(0, 10_000), max_size=3),
)
def test_retention_never_deletes_what_it_must_keep(
    history: list[CheckpointState], keep_last: int, hourly: int, daily: int,
    targets: set[str], pending: set[int],
) -> None:
    policy = RetentionPolicy(keep_last, timedelta(hours=hourly), timedelta(days=daily))
    pending_paths = {f"/c/step_{p}" for p in pending}
    plan = plan_prune(history, policy, NOW, pending_resume=pending_paths, replication_targets=targets)
    deleted = {c.path for c in plan.delete}
    by_path = {s.info.path: s for s in history}

    assert deleted.isdisjoint(plan.keep) and deleted | set(plan.keep) == set(by_path)
    order = sorted(history, key=lambda s: (s.info.step, s.info.mtime, s.info.path))
    complete = [s for s in order if s.info.complete]
    verified = [s for s in complete if s.verified]
    if not verified:
        assert not deleted
    else:
        assert verified[-1].info.path not in deleted
    for s in complete[-keep_last:]:
        assert s.info.path not in deleted
    for path in deleted:
        s = by_path[path]
        assert not s.marked
        assert path not in pending_paths
        if s.info.complete:
            assert set(targets) <= s.replicated_to
        else:  # a torn leftover of a crash is never copied offsite: it may go
            assert complete and s.info.step <= complete[-1].info.step
