"""Alerts: an event that needs a person, mailed and/or POSTed to a webhook within a minute.

Alerting events: ``recovery.budget_spent`` (a run gave up), ``checkpoint.overdue``,
the training-health findings (``training.loss_spike``, ``training.loss_nan``,
``training.throughput_drop``, ``training.straggler``, ``training.checkpoint_stalled``),
a run stopped by the restart-loop breaker or a "do not restart" exit
(``recovery.restart_loop``, ``recovery.no_restart``), and a burst of drains
(``[alerts] drained_burst`` nodes drained within 10 minutes; one alert when the burst
reaches the threshold), and a mass silence of the liveness checks (``liveness.partition``:
many nodes silent at once, taken as the network's fault, nothing drained). :func:`alerts_for` is pure.

A scheduled job scans the events after a cursor. The cursor survives restarts as
events: ``alert.sent`` (one per delivered alert, with the event id) and
``alerts.cursor`` (written when the cursor moved, at most every few minutes). A
crash between delivery and ``alert.sent`` resends that one alert after the
restart (at least once: a duplicate page beats a lost one); nothing older is
resent. The first start begins at the newest event: history does not page anyone.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from ..config.ops import AlertsConfig, SmtpConfig
from ..errors import B300Error
from ..events import ALERT_MARKS, DRAINS, TRAINING_FINDINGS, TRAINING_STOPS, Kind
from ..interfaces import NewEvent, Store
from ..model import Event
from ..payloads import (
    AlertMark,
    CheckpointOverdue,
    LivenessPartition,
    RecoveryStop,
    TrainingFinding,
    TriageVerdict,
)
from ..report.mail import alert_message, send_mail

log = structlog.get_logger(__name__)
BURST_WINDOW = timedelta(minutes=10)
_CURSOR_EVERY = timedelta(minutes=5)
WEBHOOK_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Alert:
    event_id: int
    kind: str
    ts: datetime
    summary: str
    run_id: str | None = None
    node: str | None = None
    nodes: tuple[str, ...] = ()

    def payload(self) -> dict[str, object]:
        return {"source": "b300d", "kind": self.kind, "event_id": self.event_id, "ts": self.ts.isoformat(),
                "summary": self.summary, "run_id": self.run_id, "node": self.node, "nodes": list(self.nodes)}


def alerts_for(new: Sequence[Event], recent_drains: Sequence[Event], drained_burst: int) -> list[Alert]:
    """Alerts for the ``new`` events; ``recent_drains`` are drain events of the 10 minutes before them
    (and may overlap ``new``)."""
    alerts: list[Alert] = []
    drains = sorted({e.id: e for e in [*recent_drains, *new] if e.kind in DRAINS}.values(),
                    key=lambda e: e.id)
    for e in new:
        if e.kind in (Kind.RECOVERY_BUDGET_SPENT, *TRAINING_STOPS):
            alerts.append(Alert(e.id, e.kind, e.ts, f"run {e.run_id} stopped: {RecoveryStop.of(e).why}"[:300],
                                run_id=e.run_id))
        elif e.kind == Kind.CHECKPOINT_OVERDUE:
            alerts.append(Alert(e.id, e.kind, e.ts, (CheckpointOverdue.of(e).message or
                                                     f"run {e.run_id}: checkpoint overdue")[:300],
                                run_id=e.run_id))
        elif e.kind in TRAINING_FINDINGS:
            where = f" on {e.node}" if e.node else ""
            evidence = TrainingFinding.of(e).evidence or e.kind
            alerts.append(Alert(e.id, e.kind, e.ts, f"run {e.run_id}{where}: {evidence}"[:300],
                                run_id=e.run_id, node=e.node))
        elif e.kind == Kind.LIVENESS_PARTITION:
            partition = LivenessPartition.of(e)
            nodes = partition.nodes
            listed = ", ".join(nodes[:20]) + (" ..." if len(nodes) > 20 else "")
            checked = "?" if partition.checked is None else partition.checked
            alerts.append(Alert(e.id, e.kind, e.ts, f"{len(nodes)} of {checked} nodes silent "
                                f"at once (network partition or the login node's link; nothing drained): "
                                f"{listed}"[:300], nodes=nodes))
        elif e.kind == Kind.TRIAGE_VERDICT and (v := TriageVerdict.of(e)).verdict in ("fail", "lemon"):
            summary = f"node {e.node} kept out by triage ({v.verdict}): {v.evidence}"
            alerts.append(Alert(e.id, e.kind, e.ts, summary[:300], node=e.node))
        elif e.kind in DRAINS:
            burst = [d for d in drains if d.id <= e.id and d.ts >= e.ts - BURST_WINDOW]
            # One alert when the burst reaches the threshold, not one per further drain.
            if len(burst) == drained_burst:
                nodes = tuple(sorted({d.node or "?" for d in burst}))
                alerts.append(Alert(e.id, "nodes.drained_burst", e.ts,
                                    f"{len(burst)} nodes drained within 10 min: {', '.join(nodes)}",
                                    node=e.node, nodes=nodes))
    return alerts


def post_webhook(url: str, payload: dict[str, object], timeout: float = WEBHOOK_TIMEOUT_S) -> None:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",  # noqa: S310 - http(s) only, validated in the config
                                 headers={"Content-Type": "application/json", "User-Agent": "b300d"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - as above
            if resp.status >= 300:
                raise B300Error(f"webhook answered HTTP {resp.status}")
    except (urllib.error.URLError, OSError) as exc:
        raise B300Error(f"webhook POST failed: {exc}") from None


class AlertScanner:
    """Scans new events and delivers their alerts; ``scan`` is run by the scheduler."""

    def __init__(self, store: Store, get_cfg: Callable[[], tuple[AlertsConfig, SmtpConfig | None]],
                 clock: Callable[[], datetime],
                 fence: Callable[[str], None] = lambda _action: None) -> None:
        self._fence = fence  # b300.ha.fence: proves the lease before each delivery
        self._store = store
        self._get_cfg = get_cfg
        self._clock = clock
        self._cursor: int | None = None
        self._cursor_saved_at: datetime | None = None

    def prime(self) -> None:
        """Load the cursor now (at start-up), so events recorded from here on are all scanned."""
        if self._cursor is None and self._get_cfg()[0].enabled:
            self._cursor = self._load_cursor()

    def _load_cursor(self) -> int:
        marks = self._store.events(kinds=list(ALERT_MARKS))
        if marks:
            return max(AlertMark.of(e).last_id for e in marks)
        newest = 0
        while page := self._store.events(after_id=newest, limit=5000):
            newest = page[-1].id
        self._save_cursor(newest)
        return newest

    def _save_cursor(self, last_id: int) -> None:
        now = self._clock()
        self._store.append_events([NewEvent(Kind.ALERTS_CURSOR, data={"last_id": last_id})], now)
        self._cursor_saved_at = now

    def scan(self) -> int:
        """Deliver the alerts of events after the cursor; returns how many were delivered."""
        cfg, smtp = self._get_cfg()
        if not cfg.enabled:
            return 0
        if self._cursor is None:
            self._cursor = self._load_cursor()
        fetched = self._store.events(after_id=self._cursor, limit=5000)
        new = [e for e in fetched if not e.kind.startswith("alert")]
        if not new:
            self._cursor = fetched[-1].id if fetched else self._cursor
            return 0
        first_drain = min((e.ts for e in new if e.kind in DRAINS), default=None)
        recent = (self._store.events(kinds=list(DRAINS), since=first_drain - BURST_WINDOW)
                  if first_drain is not None else [])
        sent = 0
        for alert in alerts_for(new, recent, cfg.drained_burst):
            self._fence(f"deliver alert {alert.kind}")
            if not self._deliver(alert, cfg, smtp):
                # Nothing got through: keep the cursor before it and try again next scan.
                self._cursor = alert.event_id - 1
                return sent
            self._store.append_events([NewEvent(Kind.ALERT_SENT, run_id=alert.run_id, node=alert.node, data={
                "last_id": alert.event_id, "kind": alert.kind, "summary": alert.summary})], self._clock())
            sent += 1
        self._cursor = fetched[-1].id
        saved = self._cursor_saved_at
        if saved is None or self._clock() - saved >= _CURSOR_EVERY:
            self._save_cursor(self._cursor)
        return sent

    def _deliver(self, alert: Alert, cfg: AlertsConfig, smtp: SmtpConfig | None) -> bool:
        delivered = False
        if cfg.webhook_url:
            try:
                post_webhook(cfg.webhook_url, alert.payload())
                delivered = True
            except B300Error as exc:
                log.error("alert.webhook_failed", kind=alert.kind, error=str(exc))
        if cfg.mail_to and smtp is not None:
            try:
                send_mail(smtp, alert_message(f"[b300 alert] {alert.summary[:120]}",
                                              json.dumps(alert.payload(), indent=2) + "\n",
                                              smtp.sender, cfg.mail_to))
                delivered = True
            except B300Error as exc:
                log.error("alert.mail_failed", kind=alert.kind, error=str(exc))
        if delivered:
            log.warning("alert.sent", kind=alert.kind, summary=alert.summary)
        return delivered
