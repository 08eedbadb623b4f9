"""The poll cycle's training step (b300.training.health_step) on a real SQLite store and real
progress files: findings become events once, a restarted daemon neither re-alarms nor
forgets (with its state file, and rebuilt from the files without it), reads are bounded
per cycle, an ended attempt's last lines (its exit intent) are read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from b300.model import Attempt, AttemptState
from b300.spec import dump_spec, parse_spec
from b300.store import SqlStore, open_store
from b300.training.health_step import TrainingWatch, progress_paths
from b300.training.thresholds import TrainingConfig

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
CFG = TrainingConfig.model_validate({"loss": {"window": 20, "min_points": 10},
                                     "max_read_bytes": 4096})


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


def _running(store: SqlStore, tmp_path: Path, *, health: str = "") -> Attempt:
    pattern = str(tmp_path / "progress.{host}.jsonl")
    spec = parse_spec(f'name = "w"\n[job]\ncommand = "true"\nnodes = 2\ngpus_per_node = 8\n'
                      f'[health]\nprogress_file = {json.dumps(pattern)}\nmodel_params = 1000000\n{health}')
    store.create_run("w-1", "w", dump_spec(spec), T0)
    a = store.begin_attempt("w-1", T0)
    store.confirm_attempt(a.id, 42, T0)
    return store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=["gpu01", "gpu02"], start=T0)


def _write(tmp_path: Path, host: str, lines: list[dict[str, object]]) -> None:
    with open(tmp_path / f"progress.{host}.jsonl", "a") as f:
        for line in lines:
            f.write(json.dumps({"v": 1, "host": host, **line}) + "\n")


def _steps(first: int, last: int, *, spike_at: int = -1) -> list[dict[str, object]]:
    t = T0.timestamp()
    return [{"step": s, "time": t + s, "rank": 0, "loss": 50.0 if s == spike_at else 2.0 + 0.01 * (s % 3),
             "tokens": s * 1000} for s in range(first, last + 1)]


def _watch(store: SqlStore, clock: Clock, state_dir: Path | None) -> TrainingWatch:
    return TrainingWatch(store, clock, lambda: CFG, state_dir=str(state_dir) if state_dir else None,
                         output_path=lambda a, s: None)


def _kinds(store: SqlStore, kind: str) -> list[int | None]:
    return [e.data.get("step") for e in store.events(run_id="w-1", kinds=[kind])]


def test_a_spike_is_one_event_and_a_restart_does_not_repeat_it(store: SqlStore, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path)
    clock = Clock()
    watch = _watch(store, clock, tmp_path / "state")
    _write(tmp_path, "gpu01", _steps(1, 30, spike_at=25))
    clock.now = T0 + timedelta(seconds=31)
    assert watch.check([attempt]) == 1
    assert _kinds(store, "training.loss_spike") == [25]
    fig = watch.figures()["w-1"]
    assert fig.snapshot.step == 30 and fig.snapshot.tokens_per_s and fig.snapshot.mfu
    assert fig.seconds_per_step == 1.0
    watch.check([attempt])
    # A new daemon with the state file: carries on where the old one stopped.
    again = _watch(store, clock, tmp_path / "state")
    _write(tmp_path, "gpu01", _steps(31, 40))
    clock.now = T0 + timedelta(seconds=41)
    assert again.check([attempt]) == 0
    assert again.figures()["w-1"].snapshot.step == 40
    assert _kinds(store, "training.loss_spike") == [25]
    # A daemon without it (another host of an HA pair): rebuilt from the files' tail,
    # the spike found again but not recorded again.
    (tmp_path / "state" / "training" / f"attempt-{attempt.id}.json").unlink()
    fresh = _watch(store, clock, tmp_path / "state")
    assert fresh.check([attempt]) == 0
    assert _kinds(store, "training.loss_spike") == [25]
    # A later spike is new.
    _write(tmp_path, "gpu01", _steps(41, 50, spike_at=48))
    clock.now = T0 + timedelta(seconds=51)
    assert fresh.check([attempt]) == 1
    assert _kinds(store, "training.loss_spike") == [25, 48]


def test_reads_are_bounded_per_cycle_and_a_bad_line_is_one_problem(store: SqlStore, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path)
    clock = Clock()
    watch = _watch(store, clock, None)
    _write(tmp_path, "gpu01", _steps(1, 200))
    with open(tmp_path / "progress.gpu02.jsonl", "a") as f:
        f.write("not json\n{also not\n")
    clock.now = T0 + timedelta(seconds=201)
    watch.check([attempt])
    first = watch.figures()["w-1"].snapshot.step
    assert first is not None and first < 200  # 4096 bytes a cycle: the backlog takes several
    for _ in range(20):
        watch.check([attempt])
    assert watch.figures()["w-1"].snapshot.step == 200
    problems = store.events(run_id="w-1", kinds=["training.progress_problem"])
    assert len(problems) == 1 and problems[0].data["path"].endswith("progress.gpu02.jsonl")


def test_an_exit_intent_written_just_before_the_end_is_recorded(store: SqlStore, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path)
    clock = Clock()
    watch = _watch(store, clock, tmp_path / "state")
    _write(tmp_path, "gpu01", _steps(1, 5))
    clock.now = T0 + timedelta(seconds=6)
    watch.check([attempt])
    _write(tmp_path, "gpu01", [{"step": 5, "time": T0.timestamp() + 6, "rank": 0,
                                "exit_intent": {"restart": False, "why": "dataset exhausted"}}])
    ended = store.update_attempt(attempt.id, clock.now, state=AttemptState.FAILED, exit_code=3, end=clock.now)
    watch.finish(ended)
    intent = store.events(run_id="w-1", kinds=["training.exit_intent"])
    assert [(e.data["restart"], e.data["why"]) for e in intent] == [(False, "dataset exhausted")]
    assert not (tmp_path / "state" / "training" / f"attempt-{attempt.id}.json").exists()


def test_progress_paths() -> None:
    assert progress_paths("/p/x.jsonl", ["a", "b"], 2) == ["/p/x.jsonl"]
    assert progress_paths("/p/{host}.jsonl", ["a", "b"], 16) == ["/p/a.jsonl", "/p/b.jsonl"]
    assert progress_paths("/p/{host}-{rank}", ["a", "b"], 4) == ["/p/a-0", "/p/a-1", "/p/b-2", "/p/b-3"]
    assert len(progress_paths("/p/{rank}", ["a"], 10**6)) == 4096
