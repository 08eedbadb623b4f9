"""Payloads of the daemon's own operations: failure drills, accounting outages, alerts, the weekly report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..events import ALERT_MARKS, REPORT_DELIVERY, Kind
from .base import Payload, _count, _id, _int, _key, _names, _number, _text, _truthy


@dataclass(frozen=True, slots=True)
class DrillInjected(Payload):
    """``drill.injected``: the failure drill ``drill`` pulled its node out (``output``: what the
    injection printed)."""

    KIND: ClassVar[Kind] = Kind.DRILL_INJECTED
    drill: int | None = _key(_id, None)
    node: str = _key(_text, "")
    method: str = _key(_text, "")
    inject_s: float | None = _key(_number, None)
    output: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class DrillFinished(Payload):
    """``drill.finished``: a failure drill's figures (seconds from the injection to each stage)."""

    KIND: ClassVar[Kind] = Kind.DRILL_FINISHED
    drill: int | None = _key(_id, None)
    node: str = _key(_text, "")
    method: str = _key(_text, "")
    outcome: str = _key(_text, "")
    detect_s: float | None = _key(_number, None)
    excluded_s: float | None = _key(_number, None)
    resubmit_s: float | None = _key(_number, None)
    allocation_s: float | None = _key(_number, None)
    training_s: float | None = _key(_number, None)
    resume_step: int | None = _key(_int, None)
    steps_lost: int | None = _key(_int, None)


@dataclass(frozen=True, slots=True)
class AccountingUnavailable(Payload):
    """``accounting.unavailable``: Slurm accounting (sacct/slurmdbd) stopped answering."""

    KIND: ClassVar[Kind] = Kind.ACCOUNTING_UNAVAILABLE
    error: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class AlertMark(Payload):
    """The alert scanner's bookmark (``alerts.cursor``, or the ``alert.sent`` of an alert):
    ``last_id``, the newest event it has looked at."""

    KIND: ClassVar[Kind] = ALERT_MARKS[0]
    ALSO: ClassVar[tuple[Kind, ...]] = ALERT_MARKS[1:]
    last_id: int = _key(_count, 0)
    kind: str = _key(_text, "")
    summary: str = _key(_text, "")


@dataclass(frozen=True, slots=True)
class ReportDelivery(Payload):
    """The weekly report's delivery record for ``week`` (``report.sending``, ``report.sent``,
    ``report.failed``; ``retry``: a failure that cannot have delivered the mail)."""

    KIND: ClassVar[Kind] = REPORT_DELIVERY[0]
    ALSO: ClassVar[tuple[Kind, ...]] = REPORT_DELIVERY[1:]
    week: str = _key(_text, "")
    to: tuple[str, ...] = _key(_names, ())
    message_id: str = _key(_text, "")
    error: str = _key(_text, "")
    retry: bool = _key(_truthy, False)
