"""The one duration grammar of the project: config files, job specs and b300ctl flags.

A duration is

- a number of seconds: ``90``, ``1.5`` (a TOML integer or float, not a boolean), or
- a string: a number, optional spaces, and one of the units below: ``"90s"``,
  ``"15 min"``, ``"1.5h"``, ``"2d"``, ``"1w"``; a bare ``"90"`` is seconds.

=====================  ==========
unit                   seconds
=====================  ==========
``s``, ``sec``         1
``m``, ``min``         60
``h``, ``hr``          3,600
``d``                  86,400
``w``                  604,800
=====================  ==========

Units are lower case. A duration is positive and finite, and at most
999,999,999 days (what a ``timedelta`` holds). This is the union of the two
grammars the project had (the config's ``s/sec/m/min/h/hr/d`` and
``b300ctl events --since``'s ``s/m/min/h/d/w``), so no value either accepted is
refused now. A retention *span* (``keep_hourly_for``) is a duration, or ``0`` /
``"0"`` for "rule off".

Pure functions, no pydantic: the CLI parses its flags with them without
loading the config's models.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Final

from ..errors import ConfigError, UsageError

#: Seconds per unit; the documented list above, and nothing else.
UNITS: Final = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "w": 7 * 86400}
MAX_SECONDS: Final = timedelta.max.days * 86400.0  # 999,999,999 days: what a timedelta holds
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(" + "|".join(sorted(UNITS, key=len, reverse=True)) + r")?\s*")
EXPECTED: Final = "a duration like '1h' or '90m'"


class DurationError(ValueError):
    """Not a duration. ``str()`` is the problem, worded to follow the key's name:
    ``"must be a duration like '1h' or '90m', got 'soon'"``."""


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message stays one short line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def duration_seconds(value: object) -> float:
    """Seconds from a duration (see the module docstring); raises :class:`DurationError`."""
    if isinstance(value, bool):  # a bool is an int in Python; `true` is a typo, not 1 s
        raise DurationError(f"must be {EXPECTED}, got {short_repr(value)}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m.group(1)) * UNITS[m.group(2) or "s"]
    else:
        raise DurationError(f"must be {EXPECTED}, got {short_repr(value)}")
    if math.isnan(seconds) or seconds <= 0:
        raise DurationError(f"must be positive, got {short_repr(value)}")
    if seconds > MAX_SECONDS:
        raise DurationError(f"must be at most 999999999 days, got {short_repr(value)}")
    return seconds


def is_off(value: object) -> bool:
    """``0`` or ``"0"``: a rule or schedule turned off (never ``false``, which equals 0 in Python)."""
    return not isinstance(value, bool) and value in (0, "0")


def span(value: object) -> timedelta:
    """A retention span: a duration, or ``0`` / ``"0"`` for "off" (``timedelta(0)``)."""
    if is_off(value):
        return timedelta(0)
    return timedelta(seconds=duration_seconds(value))


def parse_span(value: object, key: str, where: str, err: type[UsageError] = ConfigError) -> timedelta:
    """:func:`span`, its problem raised as ``err("{where}: {key} {problem}")`` (b300ctl's flags)."""
    try:
        return span(value)
    except DurationError as exc:
        raise err(f"{where}: {key} {exc}") from None
