"""Small validators shared by the spec and config loaders.

Each takes the value found in a TOML table and the dotted key it came from, and
returns the value or raises the given error class with a one-line message that
names the key, what was expected and what was found.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import UsageError

DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)?\s*$")
_DURATION_UNITS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def reject_unknown(
    table: Mapping[str, Any], allowed: set[str], where: str, err: type[UsageError]
) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise err(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def get_table(
    doc: Mapping[str, Any], key: str, where: str, err: type[UsageError]
) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise err(f"{where}: [{key}] must be a table, got {_short(value)}")
    return value


def get_str(
    table: Mapping[str, Any],
    key: str,
    where: str,
    err: type[UsageError],
    *,
    default: str | None = None,
    pattern: re.Pattern[str] | None = None,
    what: str = "",
) -> str | None:
    value = table.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise err(f"{where}: {key} must be a string, got {_short(value)}")
    if "\x00" in value:
        raise err(f"{where}: {key} contains a NUL byte")
    if pattern is not None and not pattern.fullmatch(value):
        raise err(f"{where}: {key} {_short(value)} is not {what or 'valid'}")
    return value


def get_int(
    table: Mapping[str, Any],
    key: str,
    where: str,
    err: type[UsageError],
    *,
    default: int | None = None,
    lo: int | None = None,
    hi: int | None = None,
) -> int | None:
    value = table.get(key, default)
    if value is None:
        return None
    # bool is an int in Python; `nodes = true` is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise err(f"{where}: {key} must be an integer, got {_short(value)}")
    if lo is not None and value < lo:
        raise err(f"{where}: {key} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise err(f"{where}: {key} must be <= {hi}, got {value}")
    return value


def get_bool(
    table: Mapping[str, Any], key: str, where: str, err: type[UsageError], *, default: bool
) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise err(f"{where}: {key} must be true or false, got {_short(value)}")
    return value


def parse_duration(value: Any, key: str, where: str, err: type[UsageError]) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"1.5h"`` or ``"2d"``."""
    if isinstance(value, bool):
        raise err(f"{where}: {key} must be a duration like '1h' or '90m', got {_short(value)}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise err(f"{where}: {key} must be a duration like '1h' or '90m', got {_short(value)}")
    if seconds <= 0:
        raise err(f"{where}: {key} must be positive, got {_short(value)}")
    return seconds
