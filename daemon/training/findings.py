"""What the detectors report: typed findings, never log lines.

Each detector returns :class:`Finding` records; the daemon decides what each becomes
(an event, a metric, an alert, an action). ``kind`` values are the suffixes of the
event kinds proposed for them (``training.loss_spike`` ...), see ``docs/design/progress.md``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class FindingKind(enum.StrEnum):
    LOSS_SPIKE = "loss_spike"
    LOSS_NAN = "loss_nan"
    THROUGHPUT_DROP = "throughput_drop"
    STRAGGLER = "straggler"
    CHECKPOINT_STALLED = "checkpoint_stalled"
    RESTART_LOOP = "restart_loop"
    NO_RESTART = "no_restart"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing worth telling a person about a run.

    ``value`` is the measured figure and ``threshold`` the limit it crossed (both in the
    unit ``evidence`` names; None where there is no figure, as for NaN); ``step`` the
    training step it concerns; ``at`` when it was found (the ``now`` passed in)."""

    kind: FindingKind
    run: str
    at: datetime
    evidence: str
    host: str | None = None
    value: float | None = None
    threshold: float | None = None
    step: int | None = None

    def event_data(self) -> dict[str, Any]:
        """The payload for the event this finding becomes (JSON-safe)."""
        data: dict[str, Any] = {"evidence": self.evidence}
        for key in ("host", "value", "threshold", "step"):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        return data
