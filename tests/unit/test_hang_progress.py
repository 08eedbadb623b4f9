"""The hang watch's progress record (``attempt.progress``) on a real SQLite store: stamped with
the progress file's mtime, the last step read once more when an attempt ends, and a step the
job wrote in non-ASCII digits ignored instead of raising."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from hang_fixtures import T0, running_attempt, write_step

from b300.model import AttemptState
from b300.recovery.hangs import HangWatch
from b300.store import open_store


def test_progress_is_stamped_with_the_write_time_and_the_last_step_read_at_the_end(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    now = [T0 + timedelta(seconds=30)]
    with open_store(f"sqlite:///{tmp_path / 'b300.db'}") as store:
        a = running_attempt(store, progress, "1h")
        watch = HangWatch(store, None, lambda: now[0])  # no Slurm: nothing is cancelled here
        write_step(progress, 10, T0 + timedelta(seconds=21.5))
        assert watch.check([a]) == 0
        # The job went on to step 14 and died; the poll never saw 14 while it ran.
        write_step(progress, 14, T0 + timedelta(seconds=33.25))
        a = store.update_attempt(a.id, T0 + timedelta(seconds=40), state=AttemptState.FAILED,
                                 end=T0 + timedelta(seconds=34))
        now[0] = T0 + timedelta(seconds=45)
        assert watch.check([]) == 0
        events = [e.data for e in store.events(run_id="r", kinds=["attempt.progress"])]
    assert events == [{"step": 10, "at": round((T0 + timedelta(seconds=21.5)).timestamp(), 3)},
                      {"step": 14, "last": True, "at": round((T0 + timedelta(seconds=33.25)).timestamp(), 3)}]


def test_a_file_written_after_the_attempt_ended_is_not_its_last_step(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    now = [T0 + timedelta(seconds=30)]
    with open_store(f"sqlite:///{tmp_path / 'b300.db'}") as store:
        a = running_attempt(store, progress, "1h")
        watch = HangWatch(store, None, lambda: now[0])
        write_step(progress, 10, T0 + timedelta(seconds=21.5))
        watch.check([a])
        store.update_attempt(a.id, T0 + timedelta(seconds=40), state=AttemptState.FAILED,
                             end=T0 + timedelta(seconds=34))
        write_step(progress, 3, T0 + timedelta(seconds=60))   # a newer attempt's
        now[0] = T0 + timedelta(seconds=61)
        watch.check([])
        steps = [e.data["step"] for e in store.events(run_id="r", kinds=["attempt.progress"])]
    assert steps == [10]


def test_a_step_in_non_ascii_digits_is_not_a_step(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    now = [T0 + timedelta(seconds=30)]
    with open_store(f"sqlite:///{tmp_path / 'b300.db'}") as store:
        a = running_attempt(store, progress, "1h")
        watch = HangWatch(store, None, lambda: now[0])
        write_step(progress, "\u00b2", T0 + timedelta(seconds=20))
        assert watch.check([a]) == 0
        store.update_attempt(a.id, T0 + timedelta(seconds=40), state=AttemptState.FAILED,
                             end=T0 + timedelta(seconds=34))
        now[0] = T0 + timedelta(seconds=45)
        assert watch.check([]) == 0
        assert store.events(run_id="r", kinds=["attempt.progress"]) == []
