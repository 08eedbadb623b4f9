"""Megatron-LM's training log line, read from the job's output (no change to the job).

Megatron-LM's ``training_log`` (``megatron/training/training.py``, read at NVIDIA/
Megatron-LM commit 001b00c2734d8f0fad096fe48a382fedf755d321) prints every
``--log-interval`` iterations, from the last rank::

     [2026-03-01 10:00:00.123456] iteration      100/  500000 | consumed samples:        12800 |
     elapsed time per iteration (ms): 1234.5 | learning rate: 1.000000E-04 | global batch size:   128 |
     lm loss: 2.345000E+00 | loss scale: 1.0 | grad norm: 0.456 | number of skipped iterations:   0 |
     number of nan iterations:   0 |

(one line). Optional fields come and go with flags (``skipped samples``, ``throughput
per GPU (TFLOP/s/GPU)``, ``energy per GPU``, ``num zeros``, ``params norm``); older
releases print no timestamp and the learning rate as ``{:.3E}``; forks add ``consumed
tokens``. So the line is read as ``key: value`` fields between ``|``, the known keys
taken and the rest ignored.

A NaN loss is not printed by Megatron (it prints a loss only when its average is
``>= 0.0``, which NaN is not); it shows as ``number of nan iterations`` > 0, which
becomes :attr:`ProgressRecord.nan_count`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, tzinfo

from .protocol import MAX_COUNT, ProgressRecord, ReadProblem, RecordSource

#: Output lines are longer than progress lines: Megatron prints its arguments, tracebacks.
MAX_LOG_LINE_BYTES = 64 * 1024
_ITERATION = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?)\]\s*)?"
    r"iteration\s+(?P<it>\d{1,16})\s*/\s*(?P<total>\d{1,16})\s*\|(?P<rest>.*)$")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|infinity)",
                     re.IGNORECASE)


def parse_megatron_line(line: bytes, offset: int, now: float, *,
                        tz: tzinfo | None = None) -> ProgressRecord | ReadProblem | None:
    """One line of the job's output -> a record if it is Megatron's iteration line.

    None for every other line (the output is mostly other things). ``tz``: the zone of
    the nodes' clocks, for Megatron's naive local timestamp; None takes the daemon's
    local zone. A line without a timestamp (older releases) is stamped ``now``."""
    if b"iteration" not in line or len(line) > MAX_LOG_LINE_BYTES:
        return None
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    m = _ITERATION.search(text)
    if m is None:
        return None
    iteration = int(m["it"])
    if iteration > MAX_COUNT:
        return ReadProblem(offset, f"Megatron iteration {iteration} is not believable")
    fields = _fields(m["rest"])
    try:
        when = _timestamp(m["ts"], tz) if m["ts"] else now
        samples = _count(fields, "consumed samples")
        tokens = _count(fields, "consumed tokens")
        ms = _number(fields, "elapsed time per iteration (ms)")
        nans = _count(fields, "number of nan iterations") or 0
        tflops = _number(fields, "throughput per GPU (TFLOP/s/GPU)")
        loss = _loss(fields)
    except ValueError as exc:
        return ReadProblem(offset, f"Megatron iteration {iteration}: {exc}")
    return ProgressRecord(
        step=iteration, time=when, source=RecordSource.MEGATRON, loss=loss, tokens=tokens,
        samples=samples, iteration_time_s=None if ms is None else ms / 1000.0, nan_count=nans,
        tflops_per_gpu=tflops)


LineResult = ProgressRecord | ReadProblem | None


def megatron_line_parser(tz: tzinfo | None = None) -> Callable[[bytes, int, float], LineResult]:
    """``parse_megatron_line`` bound to the nodes' time zone, for a tailer of the job's output."""
    def parse(line: bytes, offset: int, now: float) -> ProgressRecord | ReadProblem | None:
        return parse_megatron_line(line, offset, now, tz=tz)
    return parse


def _fields(rest: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in rest.split("|"):
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def _timestamp(text: str, tz: tzinfo | None) -> float:
    try:
        naive = datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ValueError(f"timestamp {text!r} is not a date") from None
    # No zone: naive.timestamp() takes the local zone, as Megatron's datetime.now() printed it.
    return naive.replace(tzinfo=tz).timestamp() if tz is not None else naive.timestamp()


def _number(fields: dict[str, str], key: str) -> float | None:
    value = fields.get(key)
    if value is None:
        return None
    if not _NUMBER.fullmatch(value):
        raise ValueError(f"{key} {value[:30]!r} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{key} {value[:30]!r} is not finite")
    return number


def _count(fields: dict[str, str], key: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_COUNT:
        raise ValueError(f"{key} {value[:30]!r} is not a count")
    return int(value)


def _loss(fields: dict[str, str]) -> float | None:
    """``lm loss``, else the first other ``... loss`` field (a model with its own loss name)."""
    key = "lm loss" if "lm loss" in fields else next(
        (k for k in fields if k.endswith("loss") and not k.startswith(("loss scale", "number of"))), None)
    if key is None:
        return None
    value = fields[key]
    if not _NUMBER.fullmatch(value):
        raise ValueError(f"{key} {value[:30]!r} is not a number")
    return float(value)
