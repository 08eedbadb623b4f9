"""ProgressWriter: lines that parse back, from several processes at once, and never a crash."""

from __future__ import annotations

import logging
import multiprocessing
import os
from pathlib import Path

import pytest

from b300.training.progress import ProgressWriter, default_rank
from b300.training.protocol import CheckpointEvent, ExitIntent, ProgressRecord, parse_progress_line


def _records(path: Path) -> list[ProgressRecord]:
    out = []
    for line in path.read_bytes().splitlines():
        rec = parse_progress_line(line)
        assert isinstance(rec, ProgressRecord), (line, rec)
        out.append(rec)
    return out


class _Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


class _Tensor:
    """What a framework hands over: a 0-d value that converts with float()/int()."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value

    def __int__(self) -> int:
        return int(self.value)


def test_every_kind_of_line(tmp_path: Path) -> None:
    path = tmp_path / "progress.{host}.jsonl"
    with ProgressWriter(path, host="gpu07", rank=8, clock=_Clock()) as writer:
        assert writer.step(1, loss=_Tensor(2.5), tokens=_Tensor(4096), samples=2, step_time_s=0.3)
        assert writer.checkpoint_begin(1, path=tmp_path / "ckpt")
        assert writer.checkpoint_end(1, path=tmp_path / "ckpt")
        assert writer.exit_intent(1, restart=False, why="dataset exhausted")
        assert writer.step(2, loss=float("nan"))
    recs = _records(tmp_path / "progress.gpu07.jsonl")
    assert [r.step for r in recs] == [1, 1, 1, 1, 2]
    assert recs[0].loss == 2.5 and recs[0].tokens == 4096 and recs[0].host == "gpu07" and recs[0].rank == 8
    assert [r.event for r in recs[1:3]] == [CheckpointEvent.BEGIN, CheckpointEvent.END]
    assert recs[1].path == str(tmp_path / "ckpt")
    assert recs[3].exit_intent == ExitIntent(False, "dataset exhausted")
    assert recs[4].loss_is_bad
    assert [r.time for r in recs] == sorted(r.time for r in recs)


def test_wrong_arguments_raise_at_once(tmp_path: Path) -> None:
    writer = ProgressWriter(tmp_path / "p", host="h")
    for bad in (-1, True, "3", 1.5):
        with pytest.raises(ValueError, match="step must be a non-negative integer"):
            writer.step(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host must be"):
        ProgressWriter(tmp_path / "p", host="a\nb")


def test_a_path_that_cannot_be_a_field_is_left_out(tmp_path: Path) -> None:
    writer = ProgressWriter(tmp_path / "p", host="h")
    assert writer.checkpoint_begin(5, path="/x" * 3000)
    assert writer.checkpoint_end(5, path="/bad\npath")
    assert [(r.event, r.path) for r in _records(tmp_path / "p")] == [
        (CheckpointEvent.BEGIN, None), (CheckpointEvent.END, None)]


def test_an_io_error_drops_the_line_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = ProgressWriter(tmp_path / "missing-dir" / "p", host="h")
    with caplog.at_level(logging.WARNING, logger="b300.training.progress"):
        assert not writer.step(1)
        assert not writer.step(2)
    assert writer.dropped == 2
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    (tmp_path / "missing-dir").mkdir()
    assert writer.step(3)  # works again once it can
    with pytest.raises(FileNotFoundError):
        ProgressWriter(tmp_path / "nowhere" / "p", host="h", strict=True).step(1)


def test_a_rotated_file_is_reopened(tmp_path: Path) -> None:
    path = tmp_path / "p"
    writer = ProgressWriter(path, host="h")
    writer.step(1)
    path.rename(tmp_path / "p.1")
    writer.step(2)
    path.unlink()
    writer.step(3)
    assert [r.step for r in _records(path)] == [3]
    assert [r.step for r in _records(tmp_path / "p.1")] == [1]


def test_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("B300_PROGRESS_FILE", raising=False)
    assert ProgressWriter.from_env() is None
    monkeypatch.setenv("B300_PROGRESS_FILE", str(tmp_path / "p.{host}.{rank}"))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu03")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.delenv("RANK", raising=False)
    writer = ProgressWriter.from_env()
    assert writer is not None and writer.path == str(tmp_path / "p.gpu03.5") and writer.rank == 5
    monkeypatch.setenv("RANK", "x")
    assert default_rank() == 5


def _append_many(path: str, rank: int, count: int) -> None:
    writer = ProgressWriter(path, host="node", rank=rank)
    for step in range(count):
        # A long path makes each line ~1.2 KiB: several pages' worth of lines in flight at once.
        writer.checkpoint_begin(step, path="/" + "p" * 1100 + str(rank))
    writer.close()


def test_processes_appending_to_one_file_never_tear_a_line(tmp_path: Path) -> None:
    """The O_APPEND claim, on this machine's local filesystem: 4 processes x 400 lines."""
    path = str(tmp_path / "shared.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, rank, 400)) for rank in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    recs = _records(Path(path))
    assert len(recs) == 1600
    for rank in range(4):
        assert [r.step for r in recs if r.rank == rank] == list(range(400))
    assert os.path.getsize(path) == sum(len(line) + 1 for line in Path(path).read_bytes().splitlines())
