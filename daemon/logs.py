"""structlog set-up, done once by each program's main(), never at import time."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """JSON lines for machines, readable lines in a terminal (``fmt="auto"`` picks)."""
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(sort_keys=True)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    # APScheduler's own line for a skipped cycle: b300d logs cycle.overrun instead.
    logging.getLogger("apscheduler.scheduler").addFilter(_SkippedRunFilter())


class _SkippedRunFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances" not in record.getMessage()
