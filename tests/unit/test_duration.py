"""The one duration grammar (config files, specs, b300ctl flags): what it takes, what it refuses."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b300.errors import UsageError
from b300.grammar.duration import UNITS, DurationError, duration_seconds, parse_span, span


@pytest.mark.parametrize(("value", "seconds"), [
    (90, 90.0), (1.5, 1.5), ("90", 90.0), ("90s", 90.0), ("90sec", 90.0), ("15m", 900.0), ("15min", 900.0),
    ("1.5h", 5400.0), ("2hr", 7200.0), ("2d", 172800.0), ("1w", 604800.0), (" 3 min ", 180.0), ("0.2s", 0.2),
])
def test_accepted(value: object, seconds: float) -> None:
    assert duration_seconds(value) == seconds


def test_the_unit_list_is_the_documented_one() -> None:
    assert UNITS == {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "w": 604800}


# The two grammars the project had before issue 13; every value either took must still be taken.
_CONFIG_GRAMMAR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)?\s*$")
_EVENTS_GRAMMAR = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)")


@given(st.integers(1, 10**6), st.sampled_from(["", ".5", ".25"]),
       st.sampled_from(["", " "]), st.sampled_from(["", "s", "sec", "m", "min", "h", "hr", "d", "w"]))
def test_a_superset_of_both_old_grammars(whole: int, fraction: str, space: str, unit: str) -> None:
    text = f"{whole}{fraction}{space}{unit}"
    if _CONFIG_GRAMMAR.match(text) or _EVENTS_GRAMMAR.fullmatch(text):
        assert duration_seconds(text) == pytest.approx(float(f"{whole}{fraction}") * UNITS[unit or "s"])


@pytest.mark.parametrize(("value", "problem"), [
    (True, "must be a duration like '1h' or '90m', got True"),   # a bool is an int in Python: a typo
    (False, "got False"), ("soon", "got 'soon'"), ("", "got ''"), ("1H", "got '1H'"), ("1 hour", "got"),
    ("-1h", "got '-1h'"), ("1e3", "got '1e3'"), ([1], "got [1]"), (None, "got None"),
    (0, "must be positive, got 0"), ("0s", "must be positive"), (-5, "must be positive"),
    (float("nan"), "must be positive, got nan"), (float("inf"), "at most 999999999 days"),
    ("1000000000d", "at most 999999999 days"),
])
def test_refused(value: object, problem: str) -> None:
    with pytest.raises(DurationError, match=re.escape(problem)):
        duration_seconds(value)


def test_spans_turn_off_with_zero_never_with_false() -> None:
    assert span(0) == span("0") == span(0.0) == timedelta(0)
    assert span("2w") == timedelta(days=14)
    with pytest.raises(DurationError):
        span(False)


def test_the_cli_flag_error_is_one_line_naming_the_flag() -> None:
    assert parse_span("36h", "--keep-hourly-for", "b300ctl", UsageError) == timedelta(hours=36)
    with pytest.raises(UsageError) as err:
        parse_span("a while", "--keep-hourly-for", "b300ctl", UsageError)
    assert str(err.value) == "b300ctl: --keep-hourly-for must be a duration like '1h' or '90m', got 'a while'"
    assert err.value.exit_code == 2


def test_cli_times_use_the_one_duration_grammar() -> None:
    from b300.cli.events import parse_when

    now = datetime(2026, 12, 2, 12, tzinfo=UTC)
    # Every age the config grammar accepts is an age on the command line too.
    for text, seconds in (("2h", 7200), ("90 min", 5400), ("1.5hr", 5400), ("1w", 604800), ("90", 90),
                          ("30sec", 30)):
        assert parse_when(text, now) == now - timedelta(seconds=seconds), text
    assert parse_when("2026-11-23", now) == datetime(2026, 11, 23, tzinfo=UTC)
    assert parse_when("2026-11-23T08:00+01:00", now).utcoffset() == timedelta(hours=1)
    for bad in ("yesterday", "0", "-1h", "nan", "1H", "999999999d", ""):
        with pytest.raises(UsageError, match=r"^--since: .* is not a date"):
            parse_when(bad, now)
