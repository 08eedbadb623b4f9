"""The incremental reader: torn, huge, garbage, truncated, replaced and legacy files."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from b300.training.protocol import ProgressRecord, RecordSource, encode_record
from b300.training.reader import ProgressTailer, TailState, json_object_tail, split_lines


def _line(step: int, **extra: object) -> bytes:
    return encode_record({"step": step, "time": 1_700_000_000.0 + step, **extra})


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _steps(read: object) -> list[int]:
    return [r.step for r in read.records]  # type: ignore[attr-defined]


# -- split_lines (pure) ------------------------------------------------------------------------


def test_split_keeps_the_unterminated_tail_for_later() -> None:
    split = split_lines(b"a\nbb\r\nccc", 100, skipping=False)
    assert split.lines == ((100, b"a"), (102, b"bb"))
    assert (split.consumed, split.tail, split.skipping) == (6, b"ccc", False)


def test_split_drops_a_long_line_without_buffering_it() -> None:
    split = split_lines(b"x" * 50 + b"\nok\n", 0, skipping=False, max_line=10)
    assert split.lines == ((51, b"ok"),) and split.oversized == (0,)
    # No newline yet and already too long: skip it, and the rest of it in the next chunk.
    split = split_lines(b"ok\n" + b"y" * 20, 0, skipping=False, max_line=10)
    assert split.lines == ((0, b"ok"),) and split.skipping and split.consumed == 23
    assert split.oversized == (3,)
    after = split_lines(b"yyy\nnext\n", 23, skipping=True, max_line=10)
    assert after.lines == ((27, b"next"),) and not after.skipping


def test_json_object_tail() -> None:
    assert json_object_tail(b'{"step": 3}')
    assert not json_object_tail(b'{"step": 3')
    assert not json_object_tail(b"12")   # a number may be the start of a longer one
    assert not json_object_tail(b"[1]")


# -- the tailer --------------------------------------------------------------------------------


def test_appended_lines_are_read_once_each(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    tailer = ProgressTailer(str(path))
    assert tailer.poll(0).missing
    _append(path, _line(1) + _line(2))
    assert _steps(tailer.poll(0)) == [1, 2]
    assert _steps(tailer.poll(0)) == []
    _append(path, _line(3))
    assert _steps(tailer.poll(0)) == [3]


def test_a_torn_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    line = _line(1, loss=2.0)
    _append(path, line[:20])
    tailer = ProgressTailer(str(path))
    assert tailer.poll(0).records == () and tailer.poll(0).problems == ()
    _append(path, line[20:] + _line(2))
    assert _steps(tailer.poll(0)) == [1, 2]


def test_a_complete_object_without_newline_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    _append(path, _line(1) + _line(2)[:-1])
    tailer = ProgressTailer(str(path))
    assert _steps(tailer.poll(0)) == [1, 2]
    _append(path, b"\n" + _line(3))
    assert _steps(tailer.poll(0)) == [3]


def test_garbage_is_a_problem_and_reading_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    _append(path, _line(1) + b"\xff\xfe garbage\n" + b'{"v":1,"step":"x","time":1}\n' + b"\n" + _line(2))
    read = ProgressTailer(str(path)).poll(0)
    assert _steps(read) == [1, 2]
    assert [p.what.split(":")[0] for p in read.problems] == [
        "line is not UTF-8", "step must be an integer, got 'x'"]
    assert read.problems[0].offset == len(_line(1))


def test_a_huge_line_is_skipped_across_polls_without_growing_memory(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    tailer = ProgressTailer(str(path), max_read_bytes=4096)
    _append(path, _line(1) + b'{"v":1,"junk":"' + b"z" * 3000)
    assert _steps(tailer.poll(0)) == [1]
    _append(path, b"z" * 20000)
    read = tailer.poll(0)
    assert read.records == () and len(read.problems) == 1
    assert "over the 4096-byte limit" in read.problems[0].what
    for _ in range(10):  # a 4 KiB read each: the 20 KB line is eaten in a bounded number of polls
        tailer.poll(0)
    _append(path, b'"}\n' + _line(2))
    assert _steps(tailer.poll(0)) == [2]


def test_a_truncated_file_is_read_from_the_start_and_says_reset(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    _append(path, _line(1) + _line(2) + _line(3))
    tailer = ProgressTailer(str(path))
    assert _steps(tailer.poll(0)) == [1, 2, 3]
    path.write_bytes(_line(7))
    read = tailer.poll(0)
    assert read.reset and _steps(read) == [7]


def test_a_replaced_file_is_read_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    _append(path, _line(1) + _line(2))
    tailer = ProgressTailer(str(path))
    tailer.poll(0)
    (tmp_path / "new").write_bytes(_line(1) + _line(2) + _line(3) + _line(4))
    os.replace(tmp_path / "new", path)  # same size or larger: only the inode tells
    read = tailer.poll(0)
    assert read.reset and _steps(read) == [1, 2, 3, 4]


def test_a_legacy_file_rewritten_in_place_is_read_as_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({"step": 12}))
    os.utime(path, ns=(1_700_000_000_000_000_000,) * 2)
    tailer = ProgressTailer(str(path))
    read = tailer.poll(0)
    assert [(r.step, r.time, r.source) for r in read.records] == [(12, 1_700_000_000.0, RecordSource.LEGACY)]
    assert tailer.poll(0).records == ()                     # unchanged: nothing new
    path.write_text(json.dumps({"step": 13}))                # same size, same inode
    os.utime(path, ns=(1_700_000_001_000_000_000,) * 2)
    assert _steps(tailer.poll(0)) == [13]


def test_a_legacy_file_first_seen_empty_is_still_a_snapshot(tmp_path: Path) -> None:
    """An in-place writer truncates, then writes: the first poll may see an empty file."""
    path = tmp_path / "progress.json"
    path.write_bytes(b"")
    tailer = ProgressTailer(str(path))
    assert tailer.poll(0).records == ()
    path.write_text('{"step": 5}')
    assert _steps(tailer.poll(0)) == [5]
    path.write_text('{"step": 6}')
    os.utime(path, ns=(1_700_000_009_000_000_000,) * 2)
    assert _steps(tailer.poll(0)) == [6]


def test_a_legacy_file_replaced_each_step_is_no_reset(tmp_path: Path) -> None:
    """tests/workload/train.py's way: json.dumps to a temp file, then os.replace."""
    path = tmp_path / "progress.json"
    tailer = ProgressTailer(str(path))
    for step in (1, 2, 3):
        (tmp_path / "tmp").write_text(json.dumps({"step": step, "time": 1e9 + step, "attempt": 1}))
        os.replace(tmp_path / "tmp", path)
        read = tailer.poll(0)
        assert _steps(read) == [step] and not read.reset
    path.write_text("12")
    assert _steps(tailer.poll(0)) == [12]


def test_a_snapshot_that_grows_into_lines_is_read_as_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"step": 1, "time": 5.0}\n')
    tailer = ProgressTailer(str(path))
    assert _steps(tailer.poll(0)) == [1]
    _append(path, b'{"step": 2, "time": 6.0}\n')
    assert _steps(tailer.poll(0)) == [1, 2]   # read again from the start as lines (step 1 twice)


def test_backfill_starts_near_the_end_on_a_line_boundary(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [_line(i) for i in range(200)]
    path.write_bytes(b"".join(lines))
    size = len(lines[-1])  # steps 190-199 all have lines of this length
    tailer = ProgressTailer(str(path), backfill_bytes=10 * size + 3)
    assert _steps(tailer.poll(0)) == list(range(190, 200))
    exact = ProgressTailer(str(path), backfill_bytes=10 * size)
    assert _steps(exact.poll(0)) == list(range(190, 200))


def test_state_round_trips_and_carries_on(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    _append(path, _line(1) + _line(2)[:10])
    first = ProgressTailer(str(path))
    assert _steps(first.poll(0)) == [1]
    assert first.state is not None
    saved = json.loads(json.dumps(first.state.to_dict()))
    _append(path, _line(2)[10:] + _line(3))
    second = ProgressTailer(str(path), state=TailState.from_dict(saved))
    assert _steps(second.poll(0)) == [2, 3]


def test_a_backlog_is_read_in_bounded_chunks(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"".join(_line(i) for i in range(1000)))
    tailer = ProgressTailer(str(path), max_read_bytes=8192)
    seen: list[int] = []
    for _ in range(100):
        read = tailer.poll(0)
        assert sum(len(_line(s)) for s in _steps(read)) <= 8192
        seen += _steps(read)
    assert seen == list(range(1000))


def test_an_unreadable_file_is_one_problem(tmp_path: Path) -> None:
    path = tmp_path / "dir.jsonl"
    path.mkdir()
    read = ProgressTailer(str(path)).poll(0)
    assert len(read.problems) == 1 and "cannot read" in read.problems[0].what


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.integers(0, 10**6), min_size=1, max_size=40),
       cuts=st.lists(st.integers(1, 300), max_size=40))
def test_whatever_the_write_pattern_every_record_arrives_once_in_order(
        tmp_path_factory: object, steps: list[int], cuts: list[int]) -> None:
    """The job's bytes reach the file in arbitrary pieces (a writer torn by NFS, a crash
    mid-line never finished) with polls in between: no record lost, none twice."""
    tmp = Path(str(tmp_path_factory.mktemp("tail")))  # type: ignore[attr-defined]
    path = tmp / "p.jsonl"
    blob = b"".join(_line(s, loss=0.5) for s in steps)
    path.write_bytes(b"")
    tailer = ProgressTailer(str(path))
    got: list[ProgressRecord] = []
    pos = 0
    for cut in cuts:
        _append(path, blob[pos:pos + cut])
        pos += cut
        got += tailer.poll(0).records
    _append(path, blob[pos:])
    got += tailer.poll(0).records
    assert [r.step for r in got] == steps
    assert all(r.loss == 0.5 for r in got)
