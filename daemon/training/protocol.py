"""The progress protocol, version 1: records, limits, and the parser of one line.

Standard library only: the writer in the training job imports this module too, so
what the job writes and what the daemon reads are defined once. ``docs/design/progress.md``
is the human-readable statement of the same rules.

A v1 file is UTF-8 JSON Lines, appended to, one object per line of at most
:data:`MAX_LINE_BYTES` bytes including the newline. A file whose content is a single
JSON document without ``"v"`` (``{"step": N}`` or a bare number, rewritten whole) is
the form the daemon read before v1 ("legacy"); :func:`parse_legacy_snapshot` reads it.

Every parser here is total: any bytes give a record, a :class:`ReadProblem` or
``None`` (nothing there), never an exception.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from typing import Any

VERSION = 1
#: One line, newline included. 4096 is PIPE_BUF on Linux: the writer's single
#: ``write()`` of a line this size on an O_APPEND descriptor is not interleaved
#: with another process's on a local filesystem.
MAX_LINE_BYTES = 4096
MAX_HOST_CHARS = 255
MAX_PATH_CHARS = 1024
MAX_WHY_CHARS = 500
#: A legacy snapshot file is read up to this many bytes (the pre-v1 reader's limit).
MAX_SNAPSHOT_BYTES = 4096
#: Steps and counters beyond this are not believed (2**53: exact in a float).
MAX_COUNT = 2**53


class CheckpointEvent(enum.StrEnum):
    BEGIN = "ckpt_begin"
    END = "ckpt_end"


class RecordSource(enum.StrEnum):
    PROTOCOL = "b300"       # a v1 line
    LEGACY = "legacy"       # a pre-v1 snapshot file
    MEGATRON = "megatron"   # Megatron-LM's iteration line in the job's output


@dataclass(frozen=True, slots=True)
class ExitIntent:
    """What the job says about its coming exit: ``restart=False`` asks the daemon not to
    resubmit (data exhausted, loss diverged, a person must look)."""

    restart: bool
    why: str = ""


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """One thing a job said about its progress.

    ``time`` is unix seconds from the job's clock. ``tokens`` and ``samples`` are
    counters that only grow within an attempt (a smaller value means they restarted).
    ``step_time_s`` is this host's own time for the step; ``iteration_time_s`` the
    job-wide time per step (Megatron's elapsed time per iteration). ``nan_count`` is how
    many steps since the previous record had a NaN/inf loss (Megatron's nan iterations).
    """

    step: int
    time: float
    source: RecordSource = RecordSource.PROTOCOL
    version: int = VERSION
    loss: float | None = None
    tokens: int | None = None
    samples: int | None = None
    host: str | None = None
    rank: int | None = None
    step_time_s: float | None = None
    iteration_time_s: float | None = None
    event: CheckpointEvent | None = None
    path: str | None = None
    exit_intent: ExitIntent | None = None
    nan_count: int = 0
    tflops_per_gpu: float | None = None

    @property
    def loss_is_bad(self) -> bool:
        """NaN or infinite loss in this record (its own value or Megatron's count)."""
        return self.nan_count > 0 or (self.loss is not None and not math.isfinite(self.loss))


@dataclass(frozen=True, slots=True)
class ReadProblem:
    """A line (or file) that was not a valid record; ``offset`` is its byte offset."""

    offset: int
    what: str


def parse_progress_line(line: bytes, offset: int = 0) -> ProgressRecord | ReadProblem | None:
    """One line of a v1 file (without its newline) -> a record, a problem, or None if blank.

    A line without ``"v"`` is taken as a legacy object (``{"step": N, "time": T}``)
    when it has a valid step and time: several old writers appended such lines.
    """
    if len(line) >= MAX_LINE_BYTES:
        return ReadProblem(offset, f"line of {len(line)} bytes is over the {MAX_LINE_BYTES}-byte limit")
    text = _decode(line)
    if text is None:
        return ReadProblem(offset, "line is not UTF-8")
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return ReadProblem(offset, f"not JSON: {_clip(text)}")
    if not isinstance(doc, dict):
        return ReadProblem(offset, f"not a JSON object: {_clip(text)}")
    try:
        return _record(doc, RecordSource.PROTOCOL if "v" in doc else RecordSource.LEGACY, None)
    except _Bad as exc:
        return ReadProblem(offset, str(exc))


def parse_legacy_snapshot(data: bytes, mtime: float) -> ProgressRecord | ReadProblem | None:
    """A whole pre-v1 progress file: ``{"step": N, ...}`` or a bare number.

    ``time`` is the file's ``time`` key when it has one, else ``mtime`` (when it was written).
    None for an empty file (the job has not written yet)."""
    text = _decode(data[:MAX_SNAPSHOT_BYTES])
    if text is None:
        return ReadProblem(0, "progress file is not UTF-8")
    text = text.strip()
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = text
    if isinstance(doc, str) and doc.isascii() and doc.isdigit():
        doc = int(doc)
    if isinstance(doc, int) and not isinstance(doc, bool):
        doc = {"step": doc}
    if not isinstance(doc, dict):
        return ReadProblem(0, f"progress file holds neither {{\"step\": N}} nor a number: {_clip(text)}")
    step = doc.get("step")
    if isinstance(step, str) and step.strip().isascii() and step.strip().isdigit():
        # The pre-v1 reader compared the step as text; digits in a string were common.
        doc = {**doc, "step": int(step)}
    try:
        return _record(doc, RecordSource.LEGACY, mtime)
    except _Bad as exc:
        return ReadProblem(0, str(exc))


def encode_record(fields: dict[str, Any]) -> bytes:
    """The line for ``fields`` (``v`` added), newline included; ValueError if it would not
    parse back or is over :data:`MAX_LINE_BYTES`. Non-finite losses become strings, so the
    line stays strict JSON (``jq`` and other languages read it)."""
    doc: dict[str, Any] = {"v": VERSION}
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            value = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        doc[key] = value
    line = (json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode()
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"progress line of {len(line)} bytes is over the {MAX_LINE_BYTES}-byte limit")
    parsed = parse_progress_line(line[:-1])
    if not isinstance(parsed, ProgressRecord):
        raise ValueError(parsed.what if isinstance(parsed, ReadProblem) else "empty progress line")
    return line


# -- fields ------------------------------------------------------------------------------


class _Bad(Exception):
    pass


def _record(doc: dict[str, Any], source: RecordSource, mtime: float | None) -> ProgressRecord:
    version = VERSION
    if source is RecordSource.PROTOCOL:
        version = _int(doc, "v", lo=1)
    step = _int(doc, "step")
    when = _float(doc, "time", lo=1e-9) if "time" in doc or mtime is None else mtime
    event = None
    raw_event = doc.get("event")
    if raw_event is not None:
        if not isinstance(raw_event, str):
            raise _Bad(f"event must be a string, got {_clip(repr(raw_event))}")
        # An event name this reader does not know is a later addition: ignored, not an error.
        event = CheckpointEvent(raw_event) if raw_event in _EVENTS else None
    return ProgressRecord(
        step=step,
        time=when,
        source=source,
        version=version,
        loss=_loss(doc.get("loss")),
        tokens=_opt_int(doc, "tokens"),
        samples=_opt_int(doc, "samples"),
        host=_opt_str(doc, "host", MAX_HOST_CHARS),
        rank=_opt_int(doc, "rank"),
        step_time_s=_opt_float(doc, "step_time_s"),
        event=event,
        path=_opt_str(doc, "path", MAX_PATH_CHARS),
        exit_intent=_exit_intent(doc.get("exit_intent")),
    )


_EVENTS = {e.value for e in CheckpointEvent}


def _int(doc: dict[str, Any], key: str, *, lo: int = 0) -> int:
    value = doc.get(key)
    if value is None:
        raise _Bad(f"{key} is missing")
    # bool is an int in Python: `"step": true` is a bug in the writer, not step 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{key} must be an integer, got {_clip(repr(value))}")
    if not lo <= value <= MAX_COUNT:
        raise _Bad(f"{key} must be between {lo} and 2**53, got {value}")
    return value


def _opt_int(doc: dict[str, Any], key: str) -> int | None:
    return None if doc.get(key) is None else _int(doc, key)


def _float(doc: dict[str, Any], key: str, *, lo: float = 0.0) -> float:
    value = doc.get(key)
    if value is None:
        raise _Bad(f"{key} is missing")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad(f"{key} must be a number, got {_clip(repr(value))}")
    number = float(value)
    if not math.isfinite(number) or number < lo:
        raise _Bad(f"{key} must be a finite number >= {lo:g}, got {value!r}")
    return number


def _opt_float(doc: dict[str, Any], key: str) -> float | None:
    return None if doc.get(key) is None else _float(doc, key)


_NONFINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
              "infinity": math.inf, "-infinity": -math.inf}


def _loss(value: Any) -> float | None:
    """A loss: any number, NaN and infinities included (Python's ``NaN``/``Infinity``
    tokens or the strings "nan", "inf", "-inf"): a NaN loss is news, not an error."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in _NONFINITE:
        return _NONFINITE[value.strip().lower()]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad(f"loss must be a number, got {_clip(repr(value))}")
    return float(value)


def _opt_str(doc: dict[str, Any], key: str, limit: int) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Bad(f"{key} must be a string, got {_clip(repr(value))}")
    if not value or len(value) > limit or not value.isprintable():
        raise _Bad(f"{key} must be 1-{limit} printable characters, got {_clip(repr(value))}")
    return value


def _exit_intent(value: Any) -> ExitIntent | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("restart"), bool):
        raise _Bad(f"exit_intent must be an object with a boolean restart, got {_clip(repr(value))}")
    why = value.get("why", "")
    if not isinstance(why, str):
        raise _Bad("exit_intent.why must be a string")
    # The reason is shown to people: one line, bounded.
    why = "".join(c if c.isprintable() else " " for c in why)[:MAX_WHY_CHARS]
    return ExitIntent(restart=value["restart"], why=why)


def _decode(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _clip(text: str, limit: int = 60) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
