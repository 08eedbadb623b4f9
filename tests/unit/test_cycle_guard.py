"""A watcher of the poll cycle (hangs, training health) that fails must not stop recovery:
its error is reported and the cycle goes on; a Slurm error still reaches the cycle's handling."""

from __future__ import annotations

import pytest

from b300.cycle.pipeline import CycleReport, _watch_guard
from b300.errors import SlurmError


def test_a_failing_watcher_is_reported_and_the_cycle_goes_on() -> None:
    report = CycleReport()
    after = []
    with _watch_guard("hangs", report):
        raise ValueError("event attempt.progress does not declare payload key(s) ['x']")
    after.append("recovery")
    assert after == ["recovery"]
    assert report.errors == ["hangs: ValueError: event attempt.progress does not declare payload key(s) ['x']"]


def test_a_slurm_error_is_left_to_the_cycle() -> None:
    with pytest.raises(SlurmError), _watch_guard("training", CycleReport()):
        raise SlurmError("slurmctld down")
