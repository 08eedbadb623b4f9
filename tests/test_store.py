"""The state store's behaviour, the same tests on SQLite and PostgreSQL."""

from __future__ import annotations

import inspect
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from b300.errors import ConfigError, NotFoundError, StoreError, UsageError
from b300.interfaces import AttemptUpdate, NewEvent, Store
from b300.model import AttemptState, NodeObservation, RunState
from b300.store import SqlStore, open_store
from b300.store.tables import METADATA
from store_fixtures import (  # noqa: F401  (fixtures: store, store_url, pg_database)
    pg_database_fixture,
    store_fixture,
    store_url_fixture,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _new_run(store: SqlStore, run_id: str = "llama-70b", minutes: int = 0) -> None:
    store.create_run(run_id, f"name of {run_id}", "[job]\nnodes = 2\n", at(minutes))


# -- the contract --------------------------------------------------------------


def test_sql_store_has_the_protocols_signatures() -> None:
    members = [
        name for name, value in vars(Store).items() if callable(value) and not name.startswith("_")
    ]
    assert "begin_attempt" in members
    for name in members:
        expected = inspect.signature(getattr(Store, name))
        assert inspect.signature(getattr(SqlStore, name)) == expected, name


# -- runs ----------------------------------------------------------------------


def test_create_get_and_list_runs(store: SqlStore) -> None:
    created = store.create_run("run-a", "first", "a = 1\n", at(0))
    assert created.state is RunState.SUBMITTING
    assert (created.created_at, created.updated_at, created.attempts_count) == (at(0), at(0), 0)
    store.create_run("run-b", "second", "b = 2\n", at(5))
    store.set_run_state("run-a", RunState.RUNNING, at(7))

    got = store.get_run("run-a")
    assert (got.name, got.spec_toml, got.state) == ("first", "a = 1\n", RunState.RUNNING)
    assert (got.created_at, got.updated_at) == (at(0), at(7))
    assert [r.id for r in store.list_runs()] == ["run-b", "run-a"]  # newest first
    assert [r.id for r in store.list_runs([RunState.RUNNING])] == ["run-a"]
    assert store.list_runs([RunState.COMPLETED, RunState.FAILED]) == []


def test_duplicate_run_id_is_refused_without_an_event(store: SqlStore) -> None:
    _new_run(store, "dup")
    with pytest.raises(UsageError, match="run 'dup' already exists"):
        store.create_run("dup", "again", "", at(1), [NewEvent("run.created")])
    assert store.events() == []
    assert store.get_run("dup").name == "name of dup"


@pytest.mark.parametrize("bad", ["", "Upper", "-lead", "has_underscore", "a" * 64, "a b"])
def test_invalid_run_ids_are_refused(store: SqlStore, bad: str) -> None:
    with pytest.raises(UsageError, match="invalid run id"):
        store.create_run(bad, "x", "", at(0))


# -- attempts ------------------------------------------------------------------


def test_attempt_lifecycle_numbering_and_tags(store: SqlStore) -> None:
    _new_run(store, "r1")
    first = store.begin_attempt("r1", at(1), excluded_nodes=["gpu07", "gpu09"])
    assert (first.number, first.tag, first.state) == (1, "b300-r1-a1", AttemptState.SUBMITTING)
    assert first.excluded_nodes == ("gpu07", "gpu09")
    assert (first.slurm_job_id, first.nodes, first.resume_from) == (None, (), None)

    confirmed = store.confirm_attempt(first.id, 4242, at(2))
    assert (confirmed.state, confirmed.slurm_job_id) == (AttemptState.PENDING, 4242)
    running = store.update_attempt(
        first.id, at(3), state=AttemptState.RUNNING, nodes=["gpu01", "gpu02"], start=at(3)
    )
    assert (running.state, running.nodes, running.start) == (
        AttemptState.RUNNING,
        ("gpu01", "gpu02"),
        at(3),
    )
    ended = store.update_attempt(
        first.id,
        at(9),
        state=AttemptState.NODE_FAIL,
        reason="gpu02 lost",
        exit_code=1,
        signal=9,
        end=at(8),
    )
    # Fields not given are kept.
    assert ended.nodes == ("gpu01", "gpu02")
    assert (ended.start, ended.end, ended.updated_at, ended.created_at) == (
        at(3),
        at(8),
        at(9),
        at(1),
    )
    assert (ended.reason, ended.exit_code, ended.signal) == ("gpu02 lost", 1, 9)

    second = store.begin_attempt("r1", at(10), resume_from="/ckpt/step-1000")
    assert (second.number, second.tag, second.resume_from) == (2, "b300-r1-a2", "/ckpt/step-1000")
    assert store.get_attempt(second.id) == second
    assert [a.number for a in store.attempts("r1")] == [1, 2]
    assert store.attempts("r1")[0] == ended
    assert store.get_run("r1").attempts_count == 2


@pytest.mark.parametrize(
    "state", [s for s in AttemptState if not s.is_terminal and s is not AttemptState.SUBMITTING]
)
def test_begin_attempt_is_refused_while_one_is_active(store: SqlStore, state: AttemptState) -> None:
    _new_run(store, "r1")
    first = store.begin_attempt("r1", at(1))
    with pytest.raises(UsageError, match="already has attempt 1 in state SUBMITTING"):
        store.begin_attempt("r1", at(2), events=[NewEvent("attempt.intent")])
    store.confirm_attempt(first.id, 7, at(2))
    store.update_attempt(first.id, at(3), state=state)
    with pytest.raises(UsageError, match=f"in state {state}"):
        store.begin_attempt("r1", at(4))
    assert store.events() == []  # the refused calls left no event behind

    store.update_attempt(first.id, at(5), state=AttemptState.ABANDONED)
    assert store.begin_attempt("r1", at(6)).number == 2


def test_begin_attempt_race_lets_exactly_one_through(store_url: str) -> None:
    with open_store(store_url) as setup:
        _new_run(setup, "race")
    stores = [open_store(store_url) for _ in range(6)]
    results = _run_threads([partial(s.begin_attempt, "race", at(1)) for s in stores])
    for s in stores:
        s.close()
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1
    assert all(isinstance(e, UsageError) for e in lost), lost


def test_confirm_needs_a_submitting_attempt(store: SqlStore) -> None:
    _new_run(store)
    attempt = store.begin_attempt("llama-70b", at(1))
    store.confirm_attempt(attempt.id, 100, at(2))
    with pytest.raises(UsageError, match="is PENDING, not SUBMITTING"):
        store.confirm_attempt(attempt.id, 101, at(3))
    assert store.get_attempt(attempt.id).slurm_job_id == 100


def test_active_attempts_span_runs(store: SqlStore) -> None:
    for run_id in ("a", "b", "c"):
        _new_run(store, run_id)
    a = store.begin_attempt("a", at(1))
    b = store.begin_attempt("b", at(1))
    c = store.begin_attempt("c", at(1))
    store.confirm_attempt(b.id, 11, at(2))
    store.update_attempt(c.id, at(2), state=AttemptState.ABANDONED)
    assert [(x.run_id, x.state) for x in store.active_attempts()] == [
        ("a", AttemptState.SUBMITTING),
        ("b", AttemptState.PENDING),
    ]
    assert store.active_attempts()[0] == store.get_attempt(a.id)


def test_attempts_since_are_the_recent_and_the_active_ones(store: SqlStore) -> None:
    for run_id in ("a", "b"):
        _new_run(store, run_id)
    old = store.begin_attempt("a", at(1))
    store.update_attempt(old.id, at(2), state=AttemptState.FAILED, end=at(2))
    recent = store.begin_attempt("a", at(3))
    store.update_attempt(recent.id, at(6), state=AttemptState.FAILED, end=at(6))
    active = store.begin_attempt("b", at(4))
    assert [x.id for x in store.attempts_since(at(5))] == [recent.id, active.id]
    assert [x.id for x in store.attempts_since(at(0))] == [old.id, recent.id, active.id]


def test_attempts_of_reads_many_runs_at_once(store: SqlStore) -> None:
    for run_id in ("a", "b", "c"):
        _new_run(store, run_id)
    first = store.begin_attempt("a", at(1))
    store.update_attempt(first.id, at(2), state=AttemptState.FAILED, end=at(2))
    store.begin_attempt("a", at(3))
    store.begin_attempt("b", at(3))
    got = store.attempts_of(["b", "a", "c", "nope"])
    assert got == {"b": store.attempts("b"), "a": store.attempts("a"), "c": [], "nope": []}
    assert [x.number for x in got["a"]] == [1, 2]
    assert store.attempts_of([]) == {}


# -- events --------------------------------------------------------------------


def test_events_commit_with_their_change(store: SqlStore) -> None:
    run = store.create_run("ev", "n", "", at(0), [NewEvent("run.created", data={"name": "n"})])
    attempt = store.begin_attempt("ev", at(1), events=[NewEvent("attempt.intent", actor="ctl")])
    store.confirm_attempt(attempt.id, 5, at(2), [NewEvent("attempt.submitted")])
    events = store.events()
    assert [(e.kind, e.run_id, e.attempt_id, e.actor) for e in events] == [
        ("run.created", run.id, None, "daemon"),
        # The store fills in the run and attempt an event did not name.
        ("attempt.intent", "ev", attempt.id, "ctl"),
        ("attempt.submitted", "ev", attempt.id, "daemon"),
    ]
    assert events[0].data == {"name": "n"}
    assert [e.ts for e in events] == [at(0), at(1), at(2)]
    assert events[0].id < events[1].id < events[2].id


def test_a_cycles_attempt_updates_are_one_transaction(store: SqlStore) -> None:
    ids = []
    for name in ("u1", "u2"):
        _new_run(store, name)
        a = store.begin_attempt(name, at(1))
        ids.append(store.confirm_attempt(a.id, 10 + len(ids), at(1)).id)
    done = store.update_attempts([
        AttemptUpdate(ids[0], reason="Resources"),   # a pending reason alone: no event
        AttemptUpdate(ids[1], state=AttemptState.RUNNING, nodes=["gpu01"], start=at(2),
                      events=[NewEvent("attempt.state")], run_state=RunState.RUNNING),
    ], at(3))
    assert [(a.reason, a.state) for a in done] == [("Resources", AttemptState.PENDING),
                                                   ("", AttemptState.RUNNING)]
    assert store.get_run("u2").state is RunState.RUNNING
    kinds = [(e.kind, e.run_id, e.attempt_id) for e in store.events(after_id=0)
             if e.ts == at(3)]
    assert kinds == [("attempt.state", "u2", ids[1]), ("run.state", "u2", ids[1])]
    # One failing update (an unknown attempt) leaves every other one unwritten.
    with pytest.raises(NotFoundError):
        store.update_attempts([AttemptUpdate(ids[0], reason="Priority"),
                               AttemptUpdate(987654)], at(4))
    assert store.get_attempt(ids[0]).reason == "Resources"


def test_a_failing_change_leaves_no_event(store: SqlStore) -> None:
    with pytest.raises(NotFoundError, match="unknown run 'ghost'"):
        store.set_run_state("ghost", RunState.FAILED, at(0), [NewEvent("run.state")])
    # An event that cannot be stored undoes the change it came with.
    unserializable = NewEvent("run.created", data={"name": object()})
    with pytest.raises(TypeError):
        store.create_run("half", "n", "", at(0), [NewEvent("run.state"), unserializable])
    with pytest.raises(NotFoundError):
        store.get_run("half")
    assert store.events() == []


def test_events_filter_by_run_after_id_and_limit(store: SqlStore) -> None:
    _new_run(store, "one")
    _new_run(store, "two")
    appended = store.append_events(
        [
            NewEvent("run.cancel", run_id="one"),
            NewEvent("run.state", run_id="two"),
            NewEvent("node.drained", run_id="one", node="gpu01", data={"black_hole": [1, 2]}),
            NewEvent("config.reloaded"),
        ],
        at(3),
    )
    assert [e.kind for e in appended] == ["run.cancel", "run.state", "node.drained", "config.reloaded"]
    assert store.events() == appended
    assert [e.kind for e in store.events(run_id="one")] == ["run.cancel", "node.drained"]
    assert [e.kind for e in store.events(after_id=appended[1].id)] == ["node.drained", "config.reloaded"]
    assert [e.kind for e in store.events(run_id="one", after_id=appended[0].id)] == ["node.drained"]
    assert [e.kind for e in store.events(limit=2)] == ["run.cancel", "run.state"]
    assert store.events(run_id="nobody") == []
    assert appended[2].data == {"black_hole": [1, 2]}
    assert store.append_events([], at(4)) == []


def test_event_counts_group_by_run_and_kind(store: SqlStore) -> None:
    _new_run(store, "one")
    _new_run(store, "two")
    store.append_events([
        NewEvent("training.straggler", run_id="one", node="gpu01", data={"evidence": "slow"}),
        NewEvent("training.straggler", run_id="one", node="gpu02", data={"evidence": "slow"}),
        NewEvent("training.loss_spike", run_id="two", data={"evidence": "x"}),
        NewEvent("recovery.resubmit", run_id="one"),
        NewEvent("recovery.resubmit", run_id="two"),
        NewEvent("config.reloaded"),
        NewEvent("config.reloaded"),
    ], at(3))
    kinds = ["training.straggler", "training.loss_spike", "recovery.resubmit", "config.reloaded",
             "attempt.step_relaunch"]
    assert store.event_counts(kinds) == {
        ("one", "training.straggler"): 2, ("two", "training.loss_spike"): 1,
        ("one", "recovery.resubmit"): 1, ("two", "recovery.resubmit"): 1, (None, "config.reloaded"): 2}
    # The same figures as counting the events one by one.
    by_hand: dict[tuple[str | None, str], int] = {}
    for e in store.events(kinds=kinds):
        by_hand[(e.run_id, e.kind)] = by_hand.get((e.run_id, e.kind), 0) + 1
    assert store.event_counts(kinds) == by_hand
    assert store.event_counts(["recovery.resubmit"]) == {("one", "recovery.resubmit"): 1,
                                                         ("two", "recovery.resubmit"): 1}
    assert store.event_counts([]) == {} and store.event_counts(["run.cancel"]) == {}


# -- nodes ---------------------------------------------------------------------


def test_sync_nodes_records_changes_with_events(store: SqlStore) -> None:
    first = store.sync_nodes(
        [NodeObservation("gpu02", "idle"), NodeObservation("gpu01", "mixed")], at(0)
    )
    assert [(n.name, n.state, n.updated_at) for n in first] == [
        ("gpu01", "mixed", at(0)),
        ("gpu02", "idle", at(0)),
    ]
    assert store.sync_nodes([NodeObservation("gpu01", "mixed")], at(1)) == []

    changed = store.sync_nodes(
        [NodeObservation("gpu01", "mixed"), NodeObservation("gpu02", "drain", "Xid 79")], at(2)
    )
    assert [(n.name, n.state, n.reason, n.updated_at) for n in changed] == [
        ("gpu02", "drain", "Xid 79", at(2))
    ]
    assert [(n.name, n.state, n.updated_at) for n in store.list_nodes()] == [
        ("gpu01", "mixed", at(0)),
        ("gpu02", "drain", at(2)),
    ]
    events = store.events()
    assert [(e.kind, e.node) for e in events] == [
        ("node.state", "gpu01"),
        ("node.state", "gpu02"),
        ("node.state", "gpu02"),
    ]
    assert events[0].data == {"old_state": None, "old_reason": None, "state": "mixed", "reason": ""}
    assert events[2].data == {
        "old_state": "idle",
        "old_reason": "",
        "state": "drain",
        "reason": "Xid 79",
    }


# -- errors and times ----------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get_run("nope"),
        lambda s: s.set_run_state("nope", RunState.RUNNING, at(0)),
        lambda s: s.begin_attempt("nope", at(0)),
        lambda s: s.attempts("nope"),
        lambda s: s.get_attempt(999),
        lambda s: s.confirm_attempt(999, 1, at(0)),
        lambda s: s.update_attempt(999, at(0), state=AttemptState.FAILED),
    ],
)
def test_unknown_ids_raise_not_found(store: SqlStore, call: Callable[[SqlStore], object]) -> None:
    with pytest.raises(NotFoundError, match=r"unknown (run 'nope'|attempt 999)"):
        call(store)


def test_times_come_back_utc_aware(store: SqlStore) -> None:
    tokyo = timezone(timedelta(hours=9))
    local = datetime(2025, 3, 1, 21, 0, 0, 123456, tzinfo=tokyo)
    run = store.create_run("tz", "n", "", local)
    got = store.get_run("tz")
    assert got.created_at == local
    assert got.created_at.tzinfo is UTC and run.created_at.tzinfo is UTC
    assert got.created_at.hour == 12 and got.created_at.microsecond == 123456
    attempt = store.begin_attempt("tz", local)
    store.update_attempt(attempt.id, local, start=local, end=local + timedelta(hours=1))
    stored = store.get_attempt(attempt.id)
    assert stored.start == local and stored.start is not None and stored.start.tzinfo is UTC
    assert store.append_events([NewEvent("run.state")], local)[0].ts.tzinfo is UTC
    assert store.events()[0].ts == local


def test_naive_times_are_refused(store: SqlStore) -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        store.create_run("naive", "n", "", datetime(2025, 1, 1))
    with pytest.raises(NotFoundError):
        store.get_run("naive")


def test_unreachable_database_is_a_one_line_store_error() -> None:
    with pytest.raises(StoreError) as caught:
        open_store("postgresql+psycopg://b300:s3cret@127.0.0.1:1/b300")
    message = str(caught.value)
    assert message.startswith("state store unavailable (postgresql+psycopg://b300:***@127.0.0.1:1")
    assert "\n" not in message and "s3cret" not in message


def test_unusable_urls_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="in-memory"):
        open_store("sqlite://")
    with pytest.raises(ConfigError, match="not a valid database URL"):
        open_store("not a url")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="directory"):
        open_store(f"sqlite:///{blocker / 'sub' / 'b300.db'}")


# -- migrations and concurrency ------------------------------------------------


def test_migrations_are_idempotent_and_match_the_tables(store_url: str) -> None:
    with open_store(store_url) as first:
        _new_run(first, "kept")
    with open_store(store_url) as second:
        assert second.get_run("kept").name == "name of kept"
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as conn:
            applied = set(conn.scalars(sa.text("SELECT version_num FROM alembic_version")))
            assert applied == _schema_heads()
            diff = compare_metadata(MigrationContext.configure(conn), METADATA)
    finally:
        engine.dispose()
    assert diff == []


def _schema_heads() -> set[str]:
    from importlib.resources import files

    from alembic.script import ScriptDirectory

    return set(ScriptDirectory(str(files("b300.sql"))).get_heads())


def test_concurrent_openers_migrate_once(store_url: str) -> None:
    results = _run_threads([lambda: open_store(store_url) for _ in range(4)])
    for result in results:
        assert isinstance(result, SqlStore), result
        result.close()


def test_two_sqlite_writers_do_not_lock_each_other_out(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    with open_store(url) as setup:
        _new_run(setup, "busy")
    daemon, ctl = open_store(url), open_store(url)  # like two processes: two engines

    def writes(s: SqlStore, actor: str) -> None:
        for i in range(50):
            s.append_events([NewEvent("recovery.waiting", run_id="busy", actor=actor,
                                      data={"why": str(i)})], at(i))
            s.set_run_state("busy", RunState.RUNNING, at(i))

    results = _run_threads([lambda: writes(daemon, "daemon"), lambda: writes(ctl, "ctl")])
    assert results == [None, None]
    assert len(daemon.events(run_id="busy", kinds=["recovery.waiting"])) == 100
    daemon.close()
    ctl.close()


def test_sqlite_readers_are_not_blocked_by_a_writer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with open_store(url) as s:
        _new_run(s, "seen")
        holder = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # another process mid-write
            holder.execute("UPDATE run SET name = 'uncommitted'")
            assert s.get_run("seen").name == "name of seen"
        finally:
            holder.execute("ROLLBACK")
            holder.close()


def _run_threads(calls: list[Callable[[], object]]) -> list[object]:
    """Run each call in its own thread, all released at once; results or exceptions."""
    results: list[object] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = calls[index]()
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
