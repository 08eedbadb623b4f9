"""The recoverer's training-health stops on a real SQLite store: the restart-loop row is
read from the attempts' recorded ``newest_step``; an attempt classified before that was
recorded breaks the row (its progress is unknown, so an upgrade never stops a run on
history it cannot judge); a declared exit code and an exit intent say "do not restart".
(The live tests run the whole path on Slurm: tests/live/test_training_health_live.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from b300.config import RecoveryConfig
from b300.events import Kind
from b300.interfaces import NewEvent
from b300.model import AttemptState
from b300.recovery.recoverer import Recoverer
from b300.spec import dump_spec, parse_spec, spec_of
from b300.store import SqlStore, open_store
from b300.training.thresholds import TrainingConfig

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


def _run(store: SqlStore, tmp_path: Path, evidences: list[dict[str, Any]], *, health: str = "",
         exit_code: int = 75) -> Recoverer:
    spec = parse_spec(f'name = "r"\n[job]\ncommand = "true"\nnodes = 1\n[checkpoint]\ndir = "{tmp_path}"\n'
                      f'[retries]\nretryable_exit_codes = [75]\n[health]\n{health}')
    store.create_run("r-1", "r", dump_spec(spec), T0)
    for i, evidence in enumerate(evidences):
        at = T0 + timedelta(minutes=i)
        a = store.begin_attempt("r-1", at)
        store.confirm_attempt(a.id, 10 + i, at)
        store.update_attempt(a.id, at, state=AttemptState.FAILED, exit_code=exit_code, end=at,
                             outcome="RETRYABLE_EXIT", evidence=evidence)
    # The parts a resubmission needs (Slurm, RunActions) are never reached by these checks.
    return Recoverer(store, None, None, lambda: T0, RecoveryConfig(),  # type: ignore[arg-type]
                     training=TrainingConfig.model_validate({"restart_loop": {"attempts": 2}}))


def _stop(rec: Recoverer, store: SqlStore) -> tuple[Kind, str, dict[str, object]] | None:
    run = store.get_run("r-1")
    attempts = store.attempts("r-1")
    return rec._training_stop(run, attempts[-1], spec_of(run), attempts, True)


def test_two_attempts_without_a_newer_checkpoint_stop_the_run(store: SqlStore, tmp_path: Path) -> None:
    rec = _run(store, tmp_path, [{"newest_step": 100}, {"newest_step": 100}, {"newest_step": 100}])
    stop = _stop(rec, store)
    assert stop is not None and stop[0] is Kind.RECOVERY_RESTART_LOOP
    assert stop[2] == {"attempts": [2, 3], "newest_step": 100}
    assert "newer than step 100" in stop[1]


def test_a_newer_checkpoint_resets_the_row(store: SqlStore, tmp_path: Path) -> None:
    rec = _run(store, tmp_path, [{"newest_step": None}, {"newest_step": 50}, {"newest_step": 50}])
    assert _stop(rec, store) is None


def test_attempts_classified_before_the_upgrade_break_the_row(store: SqlStore, tmp_path: Path) -> None:
    rec = _run(store, tmp_path, [{"newest_step": None}, {"outcome": "RETRYABLE_EXIT"}, {"newest_step": None}])
    assert _stop(rec, store) is None


def test_a_declared_exit_code_says_do_not_restart(store: SqlStore, tmp_path: Path) -> None:
    rec = _run(store, tmp_path, [{"newest_step": None}], health="no_restart_exit_codes = [3]", exit_code=3)
    stop = _stop(rec, store)
    assert stop is not None and stop[0] is Kind.RECOVERY_NO_RESTART and stop[2] == {"exit_code": 3}


def test_an_exit_intent_says_do_not_restart(store: SqlStore, tmp_path: Path) -> None:
    rec = _run(store, tmp_path, [{"newest_step": None}])
    assert _stop(rec, store) is None  # one attempt: no loop yet, nothing declared
    last = store.attempts("r-1")[-1]
    store.append_events([NewEvent(Kind.TRAINING_EXIT_INTENT, run_id="r-1", attempt_id=last.id,
                                  data={"restart": False, "why": "data exhausted", "step": 9})], T0)
    stop = _stop(rec, store)
    assert stop is not None and stop[1] == "not resubmitted: the job asked not to be restarted: data exhausted"
