"""A job's progress file, written by ProgressWriter, read by the tailer, judged by the monitor."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest

from b300.training.detectors import MfuInputs, TrainingMonitor
from b300.training.findings import FindingKind
from b300.training.progress import ProgressWriter
from b300.training.protocol import ExitIntent, ProgressRecord
from b300.training.reader import ProgressTailer
from b300.training.thresholds import TrainingConfig, TrainingSpec

T0 = 1_800_000_000.0
THRESHOLDS = TrainingConfig().for_run(TrainingSpec())


class _Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def test_a_job_with_two_hosts_from_file_to_findings(tmp_path: Path) -> None:
    clock = _Clock()
    pattern = str(tmp_path / "progress.{host}.jsonl")
    writers = {h: ProgressWriter(pattern, host=h, rank=r, clock=clock) for h, r in (("gpu01", 0), ("gpu02", 8))}
    tailers = [ProgressTailer(pattern.replace("{host}", h)) for h in writers]
    mfu = MfuInputs(params=1_000_000_000, gpus=16, peak_flops_per_gpu=2.25e15)
    monitor = TrainingMonitor("run-7", THRESHOLDS, attempt_start=T0, mfu=mfu)
    found = []
    for step in range(1, 301):
        clock.t = T0 + step
        slow = step > 200
        loss = math.nan if step == 250 else 3.0 + 0.01 * (step % 7)
        writers["gpu01"].step(step, loss=loss, tokens=4096 * step, step_time_s=0.5)
        writers["gpu02"].step(step, step_time_s=1.2 if slow else 0.5)
        if step == 280:
            writers["gpu01"].checkpoint_begin(step, path="/ckpt/step_280")
        for tailer in tailers:
            monitor.observe(tailer.poll(clock.t).records)
        found += monitor.evaluate(_at(clock.t))
    assert [(f.kind, f.host, f.step) for f in found] == [
        (FindingKind.STRAGGLER, "gpu02", 210), (FindingKind.LOSS_NAN, None, 250)]
    clock.t = T0 + 280 + THRESHOLDS.checkpoint_stall.timeout + 1
    stalled = monitor.evaluate(_at(clock.t))
    assert [(f.kind, f.host, f.step) for f in stalled] == [(FindingKind.CHECKPOINT_STALLED, "gpu01", 280)]
    snap = monitor.snapshot(_at(T0 + 300))
    assert snap.step == 300 and snap.stragglers == {"gpu02"} and snap.open_checkpoints == 1
    assert snap.tokens_per_s == pytest.approx(4096, rel=0.01)
    assert snap.mfu == pytest.approx(6 * 1e9 * 4096 / (16 * 2.25e15), rel=0.01)


def test_records_of_an_earlier_attempt_are_skipped_and_the_exit_intent_kept() -> None:
    monitor = TrainingMonitor("r", THRESHOLDS, attempt_start=T0)
    taken = monitor.observe([
        ProgressRecord(step=5, time=T0 - 3600, exit_intent=ExitIntent(False, "old attempt")),
        ProgressRecord(step=1, time=T0 + 5),
        ProgressRecord(step=2, time=T0 + 6, exit_intent=ExitIntent(False, "dataset exhausted")),
    ])
    assert taken == 2 and monitor.exit_intent == ExitIntent(False, "dataset exhausted")
    assert monitor.snapshot(_at(T0 + 7)).step == 2


def test_megatron_throughput_gives_mfu_directly_and_samples_become_tokens() -> None:
    mfu = MfuInputs(params=None, gpus=8, peak_flops_per_gpu=2.25e15, tokens_per_sample=4096)
    monitor = TrainingMonitor("r", THRESHOLDS, mfu=mfu, rate_window_s=60)
    monitor.observe([ProgressRecord(step=10 * i, time=T0 + 10 * i, samples=640 * i, tflops_per_gpu=900.0)
                     for i in range(1, 20)])
    snap = monitor.snapshot(_at(T0 + 190))
    assert snap.samples_per_s == pytest.approx(64.0) and snap.tokens_per_s == pytest.approx(64.0 * 4096)
    assert snap.mfu == pytest.approx(0.4)


def test_state_round_trip_through_json() -> None:
    monitor = TrainingMonitor("r", THRESHOLDS, attempt_start=T0)
    records = [ProgressRecord(step=s, time=T0 + s, loss=2.0, tokens=100 * s, host="a", step_time_s=1.0)
               for s in range(1, 100)]
    monitor.observe(records[:50])
    monitor.evaluate(_at(T0 + 50))
    copy = TrainingMonitor.from_state("r", THRESHOLDS, json.loads(json.dumps(monitor.to_state())),
                                      attempt_start=T0)
    for m in (monitor, copy):
        m.observe([*records[50:], ProgressRecord(step=100, time=T0 + 100, loss=9.0)])
    assert [f.kind for f in copy.evaluate(_at(T0 + 100))] == [FindingKind.LOSS_SPIKE]
    assert [f.kind for f in monitor.evaluate(_at(T0 + 100))] == [FindingKind.LOSS_SPIKE]
    assert copy.snapshot(_at(T0 + 100)) == monitor.snapshot(_at(T0 + 100))
