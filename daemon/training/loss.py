"""Loss spikes and NaN losses of one attempt (pure; the clock is passed in).

A spike is a loss above ``median + mad_k * 1.4826 * MAD`` of the last ``window``
losses *and* at least ``min_rise`` above that median. Median and MAD, not mean and
standard deviation, because a spike inflates the standard deviation of the window it
sits in and so hides itself and the next one; the median and MAD ignore up to half a
window of bad points (:mod:`.stats`). The test is one-sided: a loss falling fast
(early training) is below a lagging median, never a spike. ``min_rise`` keeps a very
flat curve (MAD near 0) from calling a 1% wiggle a spike.

One finding per episode: a spike (or a run of NaNs) is reported once, when it starts;
the episode ends with the first loss back under the limit (finite, for NaN). A step
lower than the last one (the job resumed from an earlier checkpoint) rewinds the
window to before that step, so the losses of the redone steps are not compared with
the later, lower ones.
"""

from __future__ import annotations

import math
from collections import deque
from datetime import datetime
from typing import Any

from .findings import Finding, FindingKind
from .protocol import ProgressRecord
from .stats import MAD_TO_SIGMA, mad, median
from .thresholds import LossSpikeThresholds


class LossMonitor:
    """Watches the losses of one attempt of ``run``; see the module docstring."""

    def __init__(self, run: str, thresholds: LossSpikeThresholds) -> None:
        self.run = run
        self.thresholds = thresholds
        self._points: deque[tuple[int, float]] = deque(maxlen=thresholds.window)
        self._in_spike = False
        self._in_nan = False
        self._pending: list[dict[str, Any]] = []

    def observe(self, record: ProgressRecord) -> None:
        """Take one record (records without a loss or NaN count are ignored)."""
        if record.loss is None and record.nan_count == 0:
            return
        self._rewind(record.step)
        if record.loss_is_bad:
            if not self._in_nan and self.thresholds.nan:
                self._pending.append(self._nan_finding(record))
            self._in_nan = True
        elif record.nan_count == 0:
            self._in_nan = False
        if record.loss is None or not math.isfinite(record.loss):
            return
        self._judge(record.step, record.loss)
        if self._points and self._points[-1][0] == record.step:
            self._points[-1] = (record.step, record.loss)
        else:
            self._points.append((record.step, record.loss))

    def evaluate(self, now: datetime) -> list[Finding]:
        """The findings since the last call, stamped ``now``."""
        found = [Finding(at=now, run=self.run, **p) for p in self._pending]
        self._pending = []
        return found

    def limit(self) -> float | None:
        """The loss above which the next point is a spike (None until ``min_points``)."""
        values = [v for _, v in self._points]
        if len(values) < self.thresholds.min_points:
            return None
        mid = median(values)
        # A floor on the scale: a window of identical values has MAD 0.
        scale = max(MAD_TO_SIGMA * mad(values, mid), 1e-12 + 1e-9 * abs(mid))
        return max(mid + self.thresholds.mad_k * scale, mid + self.thresholds.min_rise * abs(mid))

    # -- state ---------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {"points": [list(p) for p in self._points], "in_spike": self._in_spike,
                "in_nan": self._in_nan, "pending": list(self._pending)}

    @classmethod
    def from_state(cls, run: str, thresholds: LossSpikeThresholds, state: dict[str, Any]) -> LossMonitor:
        monitor = cls(run, thresholds)
        monitor._points.extend((int(s), float(v)) for s, v in state.get("points", []))
        monitor._in_spike = bool(state.get("in_spike", False))
        monitor._in_nan = bool(state.get("in_nan", False))
        monitor._pending = [_restore(p) for p in state.get("pending", [])]
        return monitor

    # -- internals -----------------------------------------------------------------------

    def _rewind(self, step: int) -> None:
        if self._points and step < self._points[-1][0]:
            kept = [p for p in self._points if p[0] < step]
            self._points.clear()
            self._points.extend(kept)
            self._in_spike = False

    def _judge(self, step: int, loss: float) -> None:
        limit = self.limit()
        if limit is None or loss <= limit:
            self._in_spike = False
            return
        if self._in_spike:
            return
        self._in_spike = True
        values = [v for _, v in self._points]
        mid = median(values)
        self._pending.append({
            "kind": FindingKind.LOSS_SPIKE, "step": step, "value": loss, "threshold": limit,
            "evidence": (f"loss {loss:.4g} at step {step} is above {limit:.4g}: median {mid:.4g} of "
                         f"the last {len(values)} losses + {self.thresholds.mad_k:g} robust sigmas, "
                         f"and at least {self.thresholds.min_rise:.0%} above it")})

    def _nan_finding(self, record: ProgressRecord) -> dict[str, Any]:
        last = f"; last finite loss {self._points[-1][1]:.4g} at step {self._points[-1][0]}" \
            if self._points else ""
        what = (f"{record.nan_count} NaN/inf iteration(s) reported" if record.nan_count
                else f"loss {record.loss}")
        return {"kind": FindingKind.LOSS_NAN, "step": record.step,
                "value": float(record.nan_count) if record.nan_count else None,
                "evidence": f"{what} at step {record.step}{last}"}


def _restore(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "kind": FindingKind(data["kind"])}
