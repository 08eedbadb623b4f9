"""One log format for b300d: structlog events and the stdlib records of APScheduler and
paramiko go through the same handler and come out as the same JSON lines (or console lines),
under the same level filter, with exceptions rendered the same way."""

from __future__ import annotations

import io
import json
import logging
import threading
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobEvent
from apscheduler.schedulers.background import BackgroundScheduler

from b300.ops.logs import CHATTY_LIBRARIES, configure_logging


class Captured:
    """What configure_logging wrote to its stream, as JSON records."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]

    def events(self) -> list[str]:
        return [r["event"] for r in self.records()]


@pytest.fixture
def captured() -> Iterator[Captured]:
    """Restores what configure_logging changes process-wide: the root logger's handlers and
    level, the chatty libraries' levels, structlog's configuration and warnings capture."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    chatty = {name: logging.getLogger(name).level for name in CHATTY_LIBRARIES}
    config = structlog.get_config()
    try:
        yield Captured()
    finally:
        logging.captureWarnings(False)
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, old in chatty.items():
            logging.getLogger(name).setLevel(old)
        structlog.configure(**config)


def test_a_stdlib_line_is_a_json_line_like_ours(captured: Captured) -> None:
    configure_logging("json", "info", stream=captured.stream)
    structlog.get_logger("b300.tracker").info("cycle.done", tracked=3)
    logging.getLogger("paramiko.transport").warning("Host key for %s changed", "gpu01")
    ours, theirs = captured.records()
    assert set(ours) == {"event", "level", "logger", "timestamp", "tracked"}
    assert (ours["event"], ours["level"], ours["logger"], ours["tracked"]) == ("cycle.done", "info",
                                                                                "b300.tracker", 3)
    assert set(theirs) == {"event", "level", "logger", "timestamp"}
    assert (theirs["event"], theirs["level"], theirs["logger"]) == ("Host key for gpu01 changed", "warning",
                                                                    "paramiko.transport")
    for r in (ours, theirs):
        stamp = datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00"))
        assert stamp.tzinfo is not None and abs((datetime.now(UTC) - stamp).total_seconds()) < 60


def test_the_level_filter_applies_to_both(captured: Captured) -> None:
    configure_logging("json", "warning", stream=captured.stream)
    ours, theirs = structlog.get_logger("b300.x"), logging.getLogger("sqlalchemy.pool")
    ours.info("ours.info")
    theirs.info("theirs.info")
    ours.warning("ours.warning")
    theirs.warning("theirs.warning")
    ours.error("ours.error")
    theirs.error("theirs.error")
    assert captured.events() == ["ours.warning", "theirs.warning", "ours.error", "theirs.error"]


def test_chatty_libraries_speak_at_debug_only(captured: Captured) -> None:
    configure_logging("json", "info", stream=captured.stream)
    for name in ("paramiko.transport", "apscheduler.executors.default", "apscheduler.scheduler"):
        logging.getLogger(name).info(f"{name} info")
        logging.getLogger(name).warning(f"{name} warning")
    logging.getLogger("alembic.runtime.migration").info("Running upgrade 0001 -> 0002")  # not chatty
    assert captured.events() == ["paramiko.transport warning", "apscheduler.executors.default warning",
                                 "apscheduler.scheduler warning", "Running upgrade 0001 -> 0002"]
    configure_logging("json", "debug", stream=captured.stream)  # a reload to debug
    logging.getLogger("paramiko.transport").info("Connected (version 2.0)")
    logging.getLogger("paramiko.transport").debug("kex algos: ...")  # wire tracing: never
    logging.getLogger("apscheduler.scheduler").debug("Looking for jobs to run")  # every wake-up: never
    structlog.get_logger("b300.x").debug("ours.debug")
    assert captured.events()[4:] == ["Connected (version 2.0)", "ours.debug"]


def test_exceptions_are_rendered_the_same_way(captured: Captured) -> None:
    configure_logging("json", "info", stream=captured.stream)
    table: dict[str, int] = {}
    try:
        table["missing"]
    except KeyError:
        structlog.get_logger("b300.service").exception("cycle.crashed")
        logging.getLogger("apscheduler.executors.default").exception("Job raised an exception")
    ours, theirs = captured.records()
    for r in (ours, theirs):
        assert r["level"] == "error"
        assert r["exception"].startswith("Traceback (most recent call last):")
        assert r["exception"].endswith("KeyError: 'missing'")
        assert "exc_info" not in r


def test_context_bound_once_reaches_stdlib_lines_too(captured: Captured) -> None:
    configure_logging("json", "info", stream=captured.stream)
    with structlog.contextvars.bound_contextvars(run="r-1", attempt=2):
        logging.getLogger("paramiko.transport").warning("Authentication failed")
        structlog.get_logger("b300.recovery").info("recovery.resubmit")
    assert [(r["run"], r["attempt"]) for r in captured.records()] == [("r-1", 2), ("r-1", 2)]


def test_calling_it_again_adds_no_handler(captured: Captured) -> None:
    first = io.StringIO()
    configure_logging("json", "info", stream=first)
    configure_logging("json", "info", stream=first)
    configure_logging("json", "info", stream=captured.stream)  # a reload: same handler, new stream
    ours = [h for h in logging.getLogger().handlers if h.__class__.__name__ == "_B300Handler"]
    assert len(ours) == 1
    logging.getLogger("alembic.runtime.migration").warning("once")
    structlog.get_logger("b300.x").warning("once too")
    assert captured.events() == ["once", "once too"] and first.getvalue() == ""


def test_warnings_are_lines_too(captured: Captured) -> None:
    configure_logging("json", "info", stream=captured.stream)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        logging.captureWarnings(True)  # catch_warnings restored showwarning; capture again inside
        warnings.warn("TripleDES has been moved", UserWarning, stacklevel=1)
    [r] = captured.records()
    assert r["logger"] == "py.warnings" and r["level"] == "warning" and "TripleDES" in r["event"]


def test_console_format(captured: Captured) -> None:
    configure_logging("console", "info", stream=captured.stream)
    structlog.get_logger("b300.x").info("cycle.done", tracked=3)
    logging.getLogger("paramiko.transport").warning("Host key changed")
    ours, theirs = captured.stream.getvalue().splitlines()
    assert "cycle.done" in ours and "tracked=3" in ours and "[b300.x]" in ours and "info" in ours
    assert "Host key changed" in theirs and "[paramiko.transport]" in theirs and "warning" in theirs
    assert not ours.startswith("{")


def test_apschedulers_skipped_run_line_is_dropped_and_the_rest_kept(captured: Captured) -> None:
    """A real scheduler whose job outlives its interval: APScheduler logs the skipped run
    (b300d says cycle.overrun instead), and that one line is dropped."""
    configure_logging("json", "debug", stream=captured.stream)
    release, skipped = threading.Event(), threading.Event()

    def slow() -> None:
        release.wait(10)

    def on_skip(event: JobEvent) -> None:
        skipped.set()

    scheduler = BackgroundScheduler(timezone=UTC)
    scheduler.add_listener(on_skip, EVENT_JOB_MAX_INSTANCES)
    scheduler.add_job(slow, "interval", seconds=0.2, id="poll", max_instances=1, coalesce=True,
                      next_run_time=datetime.now(UTC))
    scheduler.start()
    try:
        assert skipped.wait(10), "APScheduler never skipped a run"
    finally:
        release.set()
        scheduler.shutdown(wait=True)  # joins the executor's threads: their lines are written
    records = captured.records()
    assert not [r for r in records if "maximum number of running instances" in r["event"]]
    loggers = {r["logger"] for r in records}
    assert {"apscheduler.scheduler", "apscheduler.executors.default"} <= loggers
    assert any(r["event"].startswith("Running job") for r in records)
    assert any("executed successfully" in r["event"] for r in records)
