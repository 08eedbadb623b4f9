"""Checkpoint writes that began and did not end in time, per host (pure; clock passed in).

A ``ckpt_begin`` is matched with the ``ckpt_end`` of the same host and path (or the
same host and step when the end names no path). Until three saves of the attempt
were timed, an open save is stalled after ``timeout``; after that, after ``factor``
times the median of the recent save times (never less than ``min_timeout``): a
checkpoint of 2 TB that always takes 20 minutes is not stalled at 10, and one that
always takes 30 s is stalled long before the fixed 30 minutes.

Times are the job's (``time`` of the records), compared with ``now``: the nodes' and
the daemon's clocks are assumed NTP-synchronised, as for the lease. A begin stamped
in the future is taken as starting now. One finding per save.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime
from typing import Any

from .findings import Finding, FindingKind
from .protocol import CheckpointEvent, ProgressRecord
from .stats import median
from .thresholds import CheckpointStallThresholds


class CheckpointStallMonitor:
    """Watches the checkpoint saves of one attempt of ``run``; see the module docstring."""

    def __init__(self, run: str, thresholds: CheckpointStallThresholds) -> None:
        self.run = run
        self.thresholds = thresholds
        # key -> [begin time, step, path, host]
        self._open: dict[str, list[Any]] = {}
        self._durations: deque[float] = deque(maxlen=thresholds.history)
        self._flagged: set[str] = set()

    def observe(self, record: ProgressRecord) -> None:
        if record.event is None:
            return
        host = record.host or ""
        key = f"{host}|{record.path if record.path is not None else record.step}"
        if record.event is CheckpointEvent.BEGIN:
            self._open.setdefault(key, [record.time, record.step, record.path, record.host])
            return
        if key not in self._open:
            # An end without a path closes the open save of the same host and step.
            key = next((k for k, (_, step, _p, h) in self._open.items()
                        if (h or "") == host and step == record.step), key)
        begin = self._open.pop(key, None)
        self._flagged.discard(key)
        if begin is not None:
            self._durations.append(max(0.0, record.time - begin[0]))

    def limit(self) -> float:
        """Seconds after which an open save is stalled, now."""
        th = self.thresholds
        if len(self._durations) < 3:
            return th.timeout
        return max(th.min_timeout, th.factor * median(list(self._durations)))

    def open_saves(self) -> int:
        return len(self._open)

    def evaluate(self, now: datetime) -> list[Finding]:
        t = now.timestamp()
        limit = self.limit()
        found = []
        for key, (begin, step, path, host) in sorted(self._open.items()):
            elapsed = max(0.0, t - min(begin, t))
            if elapsed < limit or key in self._flagged:
                continue
            self._flagged.add(key)
            basis = (f"{self.thresholds.factor:g}x the median of the last {len(self._durations)} saves"
                     if len(self._durations) >= 3 else "the configured timeout")
            where = f" to {path}" if path else ""
            on = f" on {host}" if host else ""
            found.append(Finding(
                kind=FindingKind.CHECKPOINT_STALLED, run=self.run, at=now, host=host, step=step,
                value=elapsed, threshold=limit,
                evidence=(f"checkpoint of step {step}{where}{on} began {elapsed:.0f} s ago and has not "
                          f"ended (limit {limit:.0f} s: {basis})")))
        return found

    # -- state ---------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {"open": {k: list(v) for k, v in self._open.items()},
                "durations": list(self._durations), "flagged": sorted(self._flagged)}

    @classmethod
    def from_state(cls, run: str, thresholds: CheckpointStallThresholds,
                   state: dict[str, Any]) -> CheckpointStallMonitor:
        monitor = cls(run, thresholds)
        monitor._open = {str(k): [float(v[0]), int(v[1]), v[2], v[3]] for k, v in state.get("open", {}).items()}
        monitor._durations.extend(float(d) for d in state.get("durations", []))
        monitor._flagged = {str(k) for k in state.get("flagged", [])}
        return monitor
