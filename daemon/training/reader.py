"""Reading progress as it is appended: pure line splitting, and a thin file tailer.

:func:`split_lines` is pure: bytes in, complete lines out, with the rules for what
cannot be trusted (``docs/design/progress.md``, "What a reader does with bad input"):

- a line longer than the limit is dropped whole, however much of it there is: the
  reader skips to the next newline and never buffers more than the limit;
- an unterminated last line is left for the next read (the job may be writing it),
  unless the caller accepts it as complete (a JSON object is self-delimiting);
- a line that does not parse is a :class:`ReadProblem`; reading goes on after it.

:class:`ProgressTailer` remembers the file's device, inode and offset: a file that
was replaced (new inode) or shrank (truncated) is read again from the start and the
read says ``reset``. A file holding one pre-v1 document (``{"step": N}`` or a number,
rewritten whole) is read as a snapshot whenever its size or mtime changes. Its state
is a small frozen record, so a daemon restart can carry on from it, or rebuild from
the file's last ``backfill_bytes``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .protocol import (
    MAX_LINE_BYTES,
    MAX_SNAPSHOT_BYTES,
    ProgressRecord,
    ReadProblem,
    parse_legacy_snapshot,
    parse_progress_line,
)

#: ``(line without its newline, byte offset of the line, unix seconds now) -> result``.
LineParser = Callable[[bytes, int, float], ProgressRecord | ReadProblem | None]
DEFAULT_MAX_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class SplitLines:
    """What :func:`split_lines` found in one chunk.

    ``consumed``: bytes of the chunk that are done with (the next read starts after
    them); ``tail``: the unterminated rest (not consumed); ``oversized``: offsets of
    lines dropped for their length."""

    lines: tuple[tuple[int, bytes], ...]
    consumed: int
    skipping: bool
    tail: bytes
    oversized: tuple[int, ...]


def split_lines(data: bytes, base: int, *, skipping: bool, max_line: int = MAX_LINE_BYTES) -> SplitLines:
    """Split ``data`` (read at file offset ``base``) into complete lines.

    ``skipping``: the chunk starts inside a line already found too long (or mid-line after
    a backfill seek); its bytes up to the first newline are dropped."""
    pos = 0
    lines: list[tuple[int, bytes]] = []
    oversized: list[int] = []
    if skipping:
        nl = data.find(b"\n")
        if nl < 0:
            return SplitLines((), len(data), True, b"", ())
        pos, skipping = nl + 1, False
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        if nl + 1 - pos > max_line:
            oversized.append(base + pos)
        else:
            lines.append((base + pos, data[pos:nl].rstrip(b"\r")))
        pos = nl + 1
    tail = data[pos:]
    if len(tail) >= max_line:
        # Longer than any line may be, and still no newline: drop it and skip the rest of it.
        return SplitLines(tuple(lines), len(data), True, b"", (*oversized, base + pos))
    return SplitLines(tuple(lines), pos, False, tail, tuple(oversized))


def json_object_tail(tail: bytes) -> bool:
    """True if an unterminated last line is a complete JSON object.

    Safe to take before its newline arrives: a prefix of a JSON object that is itself a
    complete JSON object is the whole object (its outer brace closes once). Pre-v1
    writers often wrote ``json.dumps(...)`` without a newline."""
    text = tail.strip()
    if not text.startswith(b"{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def never_complete(tail: bytes) -> bool:
    """For logs: an unterminated line is always still being written."""
    return False


@dataclass(frozen=True, slots=True)
class TailState:
    """Where a tailer stands in its file; ``to_dict``/``from_dict`` round-trip through JSON."""

    dev: int
    inode: int
    offset: int
    skipping: bool = False
    mode: Literal["lines", "snapshot"] = "lines"
    snapshot_size: int = -1
    snapshot_mtime_ns: int = -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TailState:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True, slots=True)
class TailRead:
    """One poll of a tailer. ``reset``: the file was replaced or truncated since the last
    poll (steps may start over); ``missing``: there is no file (yet)."""

    records: tuple[ProgressRecord, ...] = ()
    problems: tuple[ReadProblem, ...] = ()
    reset: bool = False
    missing: bool = False


class ProgressTailer:
    """Reads what was appended to one file since the last :meth:`poll`.

    ``parse_line`` turns a line into a record (default: progress protocol v1);
    ``accept_tail`` says whether an unterminated last line is complete; ``legacy``
    reads a single pre-v1 document as a snapshot. At most ``max_read_bytes`` are read
    per poll (a backlog is read over several). ``backfill_bytes``: on the first poll
    without ``state``, start that far before the end (a daemon that restarted rebuilds
    its windows from the recent records, not the whole file)."""

    def __init__(self, path: str, *, parse_line: LineParser | None = None,
                 accept_tail: Callable[[bytes], bool] = json_object_tail, legacy: bool = True,
                 max_line_bytes: int = MAX_LINE_BYTES, report_long_lines: bool = True,
                 max_read_bytes: int = DEFAULT_MAX_READ_BYTES, backfill_bytes: int | None = None,
                 state: TailState | None = None) -> None:
        self.path = path
        self._parse = parse_line or _protocol_line
        self._accept_tail = accept_tail
        self._legacy = legacy
        self._max_line = max_line_bytes
        self._report_long = report_long_lines
        self._max_read = max(max_read_bytes, max_line_bytes)
        self._backfill = backfill_bytes
        self._state = state

    @property
    def state(self) -> TailState | None:
        return self._state

    def poll(self, now: float) -> TailRead:
        """Records appended since the last poll (``now``: unix seconds, for lines without a
        time of their own). Never raises for what is in the file; an unreadable file
        (permissions, I/O error) is one problem."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return TailRead(missing=True)
        except OSError as exc:
            return TailRead(problems=(ReadProblem(0, f"cannot stat: {exc.strerror or exc}"),))
        reset = False
        state = self._state
        try:
            if state is None or (state.dev, state.inode) != (st.st_dev, st.st_ino) or st.st_size < state.offset:
                old = state
                state = self._fresh_state(st, first=old is None)
                # A snapshot file replaced by the next snapshot is how pre-v1 jobs write: no reset.
                reset = old is not None and not (old.mode == state.mode == "snapshot")
            elif state.mode == "lines" and state.offset == 0 and not state.skipping:
                # Nothing taken from this file yet (it was empty): it may still turn out to
                # be a pre-v1 snapshot, rewritten in place.
                state = self._fresh_state(st, first=False)
            if state.mode == "snapshot":
                read = self._read_snapshot(state, st)
            else:
                read = self._read_lines(state, st.st_size, now)
        except OSError as exc:
            return TailRead(problems=(ReadProblem(0, f"cannot read: {exc.strerror or exc}"),), reset=reset)
        return TailRead(read.records, read.problems, reset=reset)

    # -- modes ---------------------------------------------------------------------------

    def _fresh_state(self, st: os.stat_result, *, first: bool) -> TailState:
        if self._legacy and 0 < st.st_size <= MAX_SNAPSHOT_BYTES and self._is_snapshot():
            return TailState(st.st_dev, st.st_ino, 0, mode="snapshot")
        if first and self._backfill is not None and st.st_size > self._backfill:
            # Start one byte early, skipping to the next newline: a line cut by the seek is
            # dropped, and a line starting exactly there is kept.
            return TailState(st.st_dev, st.st_ino, st.st_size - self._backfill - 1, skipping=True)
        return TailState(st.st_dev, st.st_ino, 0)

    def _is_snapshot(self) -> bool:
        """One JSON document without ``"v"`` (or bare digits): the pre-v1 file."""
        with open(self.path, "rb") as f:
            text = f.read(MAX_SNAPSHOT_BYTES + 1).strip()
        if text.isdigit():
            return True
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        return (isinstance(doc, dict) and "v" not in doc) or (
            isinstance(doc, int | float) and not isinstance(doc, bool))

    def _read_snapshot(self, state: TailState, st: os.stat_result) -> TailRead:
        if (state.snapshot_size, state.snapshot_mtime_ns) == (st.st_size, st.st_mtime_ns):
            return TailRead()
        with open(self.path, "rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
        if len(data) > MAX_SNAPSHOT_BYTES or b"\n" in data.strip():
            # It grew into lines: a writer appending records after all.
            self._state = TailState(st.st_dev, st.st_ino, 0)
            return self._read_lines(self._state, st.st_size, st.st_mtime_ns / 1e9)
        self._state = TailState(st.st_dev, st.st_ino, 0, mode="snapshot", snapshot_size=st.st_size,
                                snapshot_mtime_ns=st.st_mtime_ns)
        result = parse_legacy_snapshot(data, st.st_mtime_ns / 1e9)
        if isinstance(result, ProgressRecord):
            return TailRead(records=(result,))
        return TailRead(problems=(result,)) if result is not None else TailRead()

    def _read_lines(self, state: TailState, size: int, now: float) -> TailRead:
        if state.offset >= size:
            self._state = state
            return TailRead()
        with open(self.path, "rb") as f:
            f.seek(state.offset)
            data = f.read(min(size - state.offset, self._max_read))
        split = split_lines(data, state.offset, skipping=state.skipping, max_line=self._max_line)
        records: list[ProgressRecord] = []
        problems: list[ReadProblem] = []
        if self._report_long:
            problems += [ReadProblem(off, f"line over the {self._max_line}-byte limit, skipped")
                         for off in split.oversized]
        lines = list(split.lines)
        consumed = split.consumed
        at_eof = state.offset + len(data) >= size
        if split.tail and at_eof and self._accept_tail(split.tail):
            lines.append((state.offset + consumed, split.tail))
            consumed += len(split.tail)
        for offset, line in lines:
            result = self._parse(line, offset, now)
            if isinstance(result, ProgressRecord):
                records.append(result)
            elif result is not None:
                problems.append(result)
        self._state = TailState(state.dev, state.inode, state.offset + consumed, skipping=split.skipping)
        return TailRead(tuple(records), tuple(problems))


def _protocol_line(line: bytes, offset: int, now: float) -> ProgressRecord | ReadProblem | None:
    return parse_progress_line(line, offset)
