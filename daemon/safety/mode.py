"""Whether the daemon acts on what it finds, and the record of what it held back.

``[daemon] mode`` is ``"observe"`` unless the config says ``"act"``: a site meets the
daemon watching first. In observe mode it tracks, records, alerts and reports, and
never drains, downs or resumes a node, cancels or signals a job, resubmits a run,
makes a reservation or deletes a checkpoint of its own accord (commands an admin
gives through ``b300ctl`` are still carried out: they are the admin's decision).
``[recovery] enabled = false`` withholds the same node and run actions in act mode.

Every action held back is logged (``action.withheld``) and recorded as an
``action.withheld`` event naming the action, its subject and why, so an operator
reading a first week's events sees exactly what the daemon would have done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from ..events import Kind
from ..interfaces import NewEvent

log = structlog.get_logger(__name__)

OBSERVE = "observe"
ACT = "act"
MODES = (OBSERVE, ACT)

#: Actions a withheld record may name (the event's ``action``).
DRAIN, DOWN, RESUME, CANCEL, SIGNAL, RESUBMIT, RESERVE, DELETE = (
    "drain", "down", "resume", "cancel", "signal", "resubmit", "reserve", "delete")


@dataclass(frozen=True, slots=True)
class ActionPolicy:
    """What the daemon may do of its own accord; ``why`` says what holds it back."""

    nodes_and_runs: bool  # drain/down/resume nodes, cancel/resubmit runs
    signals: bool         # signal a job to checkpoint
    deletes: bool         # prune checkpoints, local or offsite
    reservations: bool    # hold spare pools
    why: str = ""

    @property
    def acting(self) -> bool:
        return self.nodes_and_runs or self.signals or self.deletes or self.reservations


class Withheld:
    """Records actions held back: one log line and one ``action.withheld`` event each,
    at most once per (action, subject) for the daemon's life, so a finding that stands
    for a week is one record, not one per cycle."""

    def __init__(self, append: Callable[[list[NewEvent], datetime], Any], why: str) -> None:
        self._append = append
        self._why = why
        self._seen: set[tuple[str, str]] = set()

    def __call__(self, action: str, subject: str, now: datetime, *, detail: str = "",
                 run_id: str | None = None, node: str | None = None, why: str = "") -> None:
        key = (action, subject)
        if key in self._seen:
            return
        self._seen.add(key)
        why = why or self._why
        log.warning("action.withheld", action=action, subject=subject, why=why, detail=detail)
        try:
            self._append([NewEvent(Kind.ACTION_WITHHELD, run_id=run_id, node=node,
                                   data={"action": action, "subject": subject, "why": why,
                                         "detail": detail})], now)
        except Exception as exc:  # the log line stands; the store may be down
            self._seen.discard(key)
            log.warning("action.withheld_unrecorded", error=str(exc))
