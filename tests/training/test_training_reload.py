"""``[training]`` on a config reload (SIGHUP): plan_reload takes it live, and a running
attempt's watch applies the new thresholds at its next cycle without losing what its
detectors saw (a straggler streak begun before the reload counts toward the new limit)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from b300.app.reloader import ConfigChange, ConfigReloader, plan_reload
from b300.config import Config, load_config
from b300.model import Attempt, AttemptState
from b300.spec import dump_spec, parse_spec
from b300.store import SqlStore, open_store
from b300.training.health_step import TrainingWatch

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


def _config(path: Path, training: str) -> None:
    path.write_text(f'[daemon]\nstate_dir = "{path.parent}"\n[training]\n{training}')


def test_plan_reload_takes_training_live(tmp_path: Path) -> None:
    path = tmp_path / "b300.toml"
    _config(path, "straggler.steps = 10\n")
    old = load_config(str(path))
    _config(path, 'straggler.steps = 4\nstraggler_action = "drain"\nloss.mad_k = 6.0\n')
    change = plan_reload(old, load_config(str(path)))
    assert change.applied == ("training",) and change.needs_restart == ()
    assert change.config.training.straggler.steps == 4
    assert change.config.training.straggler_action == "drain"
    assert change.config.training.loss.mad_k == 6.0


def _attempt(store: SqlStore, tmp_path: Path) -> Attempt:
    pattern = str(tmp_path / "p.{host}.jsonl")
    spec = parse_spec(f'name = "w"\n[job]\ncommand = "true"\nnodes = 2\n'
                      f'[health]\nprogress_file = {json.dumps(pattern)}\n')
    store.create_run("w-1", "w", dump_spec(spec), T0)
    a = store.begin_attempt("w-1", T0)
    store.confirm_attempt(a.id, 42, T0)
    return store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=["gpu01", "gpu02"], start=T0)


def _steps(tmp_path: Path, first: int, last: int) -> None:
    for host in ("gpu01", "gpu02"):
        with open(tmp_path / f"p.{host}.jsonl", "a") as f:
            for s in range(first, last + 1):
                f.write(json.dumps({"v": 1, "host": host, "step": s, "time": T0.timestamp() + s,
                                    "step_time_s": 1.0 if host == "gpu02" else 0.2}) + "\n")


def test_a_reload_retunes_running_watches_and_keeps_their_state(store: SqlStore, tmp_path: Path) -> None:
    path = tmp_path / "b300.toml"
    _config(path, "straggler.steps = 10\n")
    box: list[Config] = [load_config(str(path))]
    now = [T0]
    watch = TrainingWatch(store, lambda: now[0], lambda: box[0].training, state_dir=str(tmp_path / "s"),
                          output_path=lambda a, s: None)

    def apply(old: Config, change: ConfigChange) -> None:
        box[0] = change.config

    reloader = ConfigReloader(str(path), lambda: box[0], apply, store, lambda: now[0])
    attempt = _attempt(store, tmp_path)
    # Steps 1-4 slow (and 5 read but not judged yet: the hosts' next step decides it).
    _steps(tmp_path, 1, 5)
    now[0] = T0 + timedelta(seconds=6)
    assert watch.check([attempt]) == 0
    _config(path, "straggler.steps = 6\n")
    reloader.reload()
    reloaded = store.events(kinds=["config.reloaded"])
    assert [e.data["changed"] for e in reloaded] == [["training"]]
    # Steps 5 and 6 judged under the new limit: the streak of 6 began before the reload.
    _steps(tmp_path, 6, 7)
    now[0] = T0 + timedelta(seconds=8)
    assert watch.check([attempt]) == 1
    found = store.events(run_id="w-1", kinds=["training.straggler"])
    assert [e.data["step"] for e in found] == [6]
    assert "limit 1.3x for 6 steps" in found[0].data["evidence"]
    # The state file carries the retuned watch on: a new daemon reading it finds nothing again.
    again = TrainingWatch(store, lambda: now[0], lambda: box[0].training, state_dir=str(tmp_path / "s"),
                          output_path=lambda a, s: None)
    assert again.check([attempt]) == 0
