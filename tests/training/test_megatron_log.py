"""Megatron-LM's iteration line, written here exactly as its code formats it.

Source read: NVIDIA/Megatron-LM, ``megatron/training/training.py``, function
``training_log``, at commit 001b00c2734d8f0fad096fe48a382fedf755d321 (the
``log_string`` built under ``if iteration % args.log_interval == 0``). The builder
below repeats its format strings field by field, in its order; the parser under test
does not share any of it. The older form (no timestamp, ``learning rate: {:.3E}``,
loss printed only when ``> 0``) is the one of earlier releases.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from b300.training.megatron import megatron_line_parser, parse_megatron_line
from b300.training.protocol import ProgressRecord, ReadProblem, RecordSource
from b300.training.reader import ProgressTailer, never_complete

NOW = 1_800_000_000.0


def megatron_line(*, when: datetime | None, iteration: int, train_iters: int, consumed_samples: int,
                  elapsed_time_per_iteration: float, learning_rate: float | None, batch_size: int,
                  losses: dict[str, float], loss_scale: float, grad_norm: float | None = None,
                  num_zeros_in_grad: int | None = None, params_norm: float | None = None,
                  skipped: int = 0, nan: int = 0, skipped_train_samples: int = 0,
                  throughput: float | None = None, old: bool = False) -> str:
    """``training_log``'s ``log_string``, statement by statement."""
    log_string = f" [{when.strftime('%Y-%m-%d %H:%M:%S.%f')}]" if when is not None else ""
    log_string += f" iteration {iteration:8d}/{train_iters:8d} |"
    log_string += f" consumed samples: {consumed_samples:12d} |"
    if skipped_train_samples > 0:
        log_string += f" skipped samples: {skipped_train_samples:12d} |"
    log_string += f" elapsed time per iteration (ms): {elapsed_time_per_iteration * 1000.0:.1f} |"
    if throughput is not None:
        log_string += f" throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |"
    if learning_rate is not None:
        log_string += (f" learning rate: {learning_rate:.3E} |" if old
                       else f" learning rate: {learning_rate:.6E} |")
    log_string += f" global batch size: {batch_size:5d} |"
    for key, avg in losses.items():
        if (avg > 0.0) if old else (avg >= 0.0):
            log_string += f" {key}: {avg:.6E} |"
    log_string += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        log_string += f" grad norm: {grad_norm:.3f} |"
    if num_zeros_in_grad is not None:
        log_string += f" num zeros: {num_zeros_in_grad} |"
    if params_norm is not None:
        log_string += f" params norm: {params_norm:.3f} |"
    log_string += f" number of skipped iterations: {skipped:3d} |"
    log_string += f" number of nan iterations: {nan:3d} |"
    return log_string


def _parse(text: str, tz: timezone | None = UTC) -> ProgressRecord | ReadProblem | None:
    return parse_megatron_line(text.encode(), 0, NOW, tz=tz)


def test_the_current_line() -> None:
    when = datetime(2026, 3, 1, 10, 0, 0, 123456)
    line = megatron_line(when=when, iteration=100, train_iters=500000, consumed_samples=12800,
                         elapsed_time_per_iteration=1.2345, learning_rate=1e-4, batch_size=128,
                         losses={"lm loss": 2.345}, loss_scale=1.0, grad_norm=0.456)
    assert line.startswith(" [2026-03-01 10:00:00.123456] iteration      100/  500000 | consumed samples:")
    assert "| lm loss: 2.345000E+00 |" in line and line.endswith("number of nan iterations:   0 |")
    rec = _parse(line)
    assert isinstance(rec, ProgressRecord)
    assert rec.step == 100 and rec.samples == 12800 and rec.loss == pytest.approx(2.345)
    assert rec.iteration_time_s == pytest.approx(1.2345, abs=1e-4) and rec.nan_count == 0
    assert rec.time == when.replace(tzinfo=UTC).timestamp() and rec.source is RecordSource.MEGATRON


def test_every_optional_field() -> None:
    line = megatron_line(when=datetime(2026, 3, 1, 10, 0, 0), iteration=7, train_iters=10,
                         consumed_samples=70, elapsed_time_per_iteration=0.5, learning_rate=None,
                         batch_size=10, losses={"lm loss": 3.0, "mtp_1 loss": 3.5}, loss_scale=65536.0,
                         grad_norm=1.5, num_zeros_in_grad=12, params_norm=300.25, skipped=1,
                         skipped_train_samples=4, throughput=512.3)
    rec = _parse(line)
    assert isinstance(rec, ProgressRecord)
    assert rec.loss == 3.0 and rec.tflops_per_gpu == pytest.approx(512.3) and rec.samples == 70


def test_the_older_line_without_timestamp_is_stamped_now() -> None:
    line = megatron_line(when=None, iteration=20, train_iters=100, consumed_samples=640,
                         elapsed_time_per_iteration=13.1053, learning_rate=1.2e-5, batch_size=64,
                         losses={"lm loss": 11.0}, loss_scale=1.0, old=True)
    assert "learning rate: 1.200E-05 |" in line
    rec = _parse(line)
    assert isinstance(rec, ProgressRecord) and rec.time == NOW and rec.loss == 11.0


def test_a_nan_shows_as_nan_iterations_with_no_loss_printed() -> None:
    line = megatron_line(when=datetime(2026, 3, 1, 10, 0), iteration=300, train_iters=1000,
                         consumed_samples=3000, elapsed_time_per_iteration=1.0, learning_rate=1e-4,
                         batch_size=10, losses={"lm loss": math.nan}, loss_scale=1.0, skipped=1, nan=1)
    assert "lm loss" not in line   # NaN >= 0.0 is False: Megatron leaves it out
    rec = _parse(line)
    assert isinstance(rec, ProgressRecord) and rec.loss is None and rec.nan_count == 1 and rec.loss_is_bad


def test_srun_labels_and_carriage_returns_around_the_line() -> None:
    line = megatron_line(when=datetime(2026, 3, 1, 10, 0), iteration=5, train_iters=10,
                         consumed_samples=50, elapsed_time_per_iteration=0.25, learning_rate=1e-3,
                         batch_size=10, losses={"lm loss": 4.0}, loss_scale=1.0)
    rec = _parse("3: " + line + "\r")
    assert isinstance(rec, ProgressRecord) and rec.step == 5


def test_the_nodes_time_zone_is_applied() -> None:
    line = megatron_line(when=datetime(2026, 3, 1, 10, 0), iteration=5, train_iters=10,
                         consumed_samples=50, elapsed_time_per_iteration=0.25, learning_rate=1e-3,
                         batch_size=10, losses={"lm loss": 4.0}, loss_scale=1.0)
    plus2 = _parse(line, tz=timezone(timedelta(hours=2)))
    utc = _parse(line, tz=UTC)
    assert isinstance(plus2, ProgressRecord) and isinstance(utc, ProgressRecord)
    assert utc.time - plus2.time == 7200


@pytest.mark.parametrize("text", [
    " validation loss at iteration 100 | lm loss value: 2.301000E+00 | lm loss PPL: 9.984E+00 | ",
    "[after training is done] datetime: 2026-03-01 10:00:00 ",
    "building GPT model ...",
    " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 1234",
    "",
])
def test_other_output_is_not_a_record(text: str) -> None:
    assert _parse(text) is None


@pytest.mark.parametrize(("text", "what"), [
    (" iteration 5/ 10 | consumed samples: many |", "consumed samples 'many' is not a count"),
    (" iteration 5/ 10 | elapsed time per iteration (ms): fast |", "is not a number"),
    (" iteration 5/ 10 | lm loss: low |", "lm loss 'low' is not a number"),
    (" [2026-13-45 99:00:00.0] iteration 5/ 10 | lm loss: 1.0 |", "is not a date"),
    (" iteration 9999999999999999/ 1 |", "not believable"),
])
def test_a_broken_iteration_line_is_a_problem(text: str, what: str) -> None:
    problem = _parse(text)
    assert isinstance(problem, ReadProblem) and what in problem.what


def test_tailing_a_job_output_file(tmp_path: Path) -> None:
    out = tmp_path / "slurm-123.out"
    lines = [megatron_line(when=datetime(2026, 3, 1, 10, 0, i), iteration=10 * i, train_iters=100,
                           consumed_samples=100 * i, elapsed_time_per_iteration=1.0, learning_rate=1e-4,
                           batch_size=10, losses={"lm loss": 5.0 - i / 10}, loss_scale=1.0)
             for i in range(1, 6)]
    noise = "Traceback-like noise " + "x" * 100_000  # longer than any line we keep
    out.write_text("\n".join(["starting", lines[0], noise, lines[1], lines[2]]) + "\n" + lines[3][:40])
    tailer = ProgressTailer(str(out), parse_line=megatron_line_parser(UTC), accept_tail=never_complete,
                            legacy=False, max_line_bytes=64 * 1024, report_long_lines=False)
    read = tailer.poll(NOW)
    assert [r.step for r in read.records] == [10, 20, 30] and read.problems == ()
    with open(out, "a") as f:
        f.write(lines[3][40:] + "\n" + lines[4] + "\n")
    assert [r.step for r in tailer.poll(NOW).records] == [40, 50]
