"""The launcher ending a step for a newer plan: its srun is killed as soon as Slurm no
longer lists the step (an srun whose step held a powered-off node waits for that node),
and waited for (up to the timeout) while Slurm lists it. The srun here is a real process
that ignores SIGTERM, as an srun stuck on a silent node does; Slurm's answers are fed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from b300.launcher import launch as lf
from b300.launcher.steps import SRUN_GRACE_S, AfterCancel, after_cancel


@pytest.mark.parametrize(("returned", "gone_for", "waited", "move"), [
    (True, None, 0.0, AfterCancel.RETURNED),
    (True, 5.0, 90.0, AfterCancel.RETURNED),         # srun's own end always wins
    (False, None, 10.0, AfterCancel.WAIT),           # listed (or squeue could not tell)
    (False, 0.5, 1.0, AfterCancel.WAIT),             # just gone: srun gets its grace
    (False, SRUN_GRACE_S, 3.0, AfterCancel.GONE),
    (False, None, 60.0, AfterCancel.TIMEOUT),        # still listed after the wait
    (False, 0.1, 60.0, AfterCancel.TIMEOUT),
])
def test_after_cancel(returned: bool, gone_for: float | None, waited: float, move: AfterCancel) -> None:
    assert after_cancel(returned, gone_for, waited, timeout_s=60.0) is move


class FedLauncher(lf.Launcher):
    """A launcher whose Slurm answers are given: ``listed`` answers of squeue, in turn (the
    last one repeats); None stands for a failed squeue."""

    def __init__(self, tmp_path: Path, listed: list[list[tuple[str, str]] | None]) -> None:
        super().__init__(tmp_path, 7, nodes=2, tasks_per_node=1, command="true", hold_s=5,
                         poll_s=0.05)
        self.listed, self.cancelled, self.asked = listed, list[str](), 0

    def cancel(self, step_id: str) -> None:
        self.cancelled.append(step_id)

    def steps(self) -> list[tuple[str, str]] | None:
        self.asked += 1
        return self.listed[min(self.asked, len(self.listed)) - 1]


def _stuck_srun(seconds: float = 120) -> subprocess.Popen[bytes]:
    code = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep({seconds})"
    return subprocess.Popen([sys.executable, "-c", code])


def test_srun_is_killed_once_slurm_no_longer_lists_the_step(tmp_path: Path) -> None:
    launcher = FedLauncher(tmp_path, [[("7.0", "gpu[01-02]")], None, [("7.1", "gpu03")]])
    launcher.proc = _stuck_srun()
    t0 = time.monotonic()
    rc, returned = launcher.stop("7.0")
    took = time.monotonic() - t0
    assert launcher.cancelled == ["7.0"]
    assert (rc, returned) == (-9, False)
    # Gone at the third answer (about 2 s in: squeue once a second), then the grace.
    assert SRUN_GRACE_S <= took < SRUN_GRACE_S + 5, took
    assert launcher.asked <= 10


def test_srun_is_waited_for_while_the_step_is_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lf, "SRUN_WAIT_S", 3.0)
    launcher = FedLauncher(tmp_path, [[("7.0", "gpu[01-02]")]])
    launcher.proc = _stuck_srun()
    t0 = time.monotonic()
    rc, returned = launcher.stop("7.0")
    assert (rc, returned) == (-9, False)
    assert 3.0 <= time.monotonic() - t0 < 6.0


def test_an_srun_that_returns_by_itself_says_so(tmp_path: Path) -> None:
    launcher = FedLauncher(tmp_path, [[]])           # gone at once, but srun ends within the grace
    code = "import time; time.sleep(0.5); raise SystemExit(3)"
    launcher.proc = subprocess.Popen([sys.executable, "-c", code])
    assert launcher.stop("7.0") == (3, True)
