"""Logging set-up, done by each program's main() (and again on a config reload), never at
import time.

Every line goes through one stdlib handler on the root logger whose formatter is
structlog's :class:`~structlog.stdlib.ProcessorFormatter`, so b300's own structlog events
and the stdlib records of the libraries it runs (APScheduler, paramiko, alembic, SQLAlchemy,
``warnings``) come out in one format: JSON lines (``event``, ``level``, ``logger``,
``timestamp``, the event's keys, ``exception`` as text) or console lines. The level filter
applies to both: structlog drops calls below it before any work, the root logger drops
stdlib records below it.

Some libraries are quieter than the level: their INFO lines are per-operation chatter
(APScheduler: a line before and after every scheduled job run; paramiko: every SSH connect
and authentication; alembic (recent releases): a line per plugin it sets up, at every start), so they
show at ``debug`` only, and their DEBUG lines (every scheduler
wake-up, wire-level tracing) never do; their warnings and errors always do.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import Processor

#: Libraries whose INFO is b300's DEBUG (see the module docstring).
CHATTY_LIBRARIES = ("apscheduler", "paramiko", "alembic.runtime.plugins")


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """JSON lines for machines, readable lines in a terminal (``fmt="auto"`` picks), at ``level``
    (debug, info, warning, error), on ``stream`` (default stderr: the journal under systemd).

    Idempotent: calling it again (a config reload) reconfigures the one handler it installed
    instead of adding another, so no line is ever written twice.
    """
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    threshold = logging.getLevelName(level.upper())
    if not isinstance(threshold, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer: Processor = (
        structlog.processors.JSONRenderer(sort_keys=True)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    # Run on every line, whichever side it comes from (structlog's, or a stdlib record's).
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _B300Handler)), None)
    if handler is None:
        handler = _B300Handler(out)
        root.addHandler(handler)
    else:
        handler.setStream(out)
    handler.setFormatter(formatter)
    root.setLevel(threshold)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.INFO if threshold <= logging.DEBUG
                                         else max(threshold, logging.WARNING))
    logging.captureWarnings(True)


class _B300Handler(logging.StreamHandler[TextIO]):
    """The one handler :func:`configure_logging` installs (found again by its class)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.addFilter(_SkippedRunFilter())


class _SkippedRunFilter(logging.Filter):
    """Drops APScheduler's line for a skipped run: b300d logs ``cycle.overrun`` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("apscheduler")
                    and "maximum number of running instances" in record.getMessage())
