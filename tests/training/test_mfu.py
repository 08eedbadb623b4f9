"""MFU = 6 N tokens/s / (GPUs x peak): figures worked by hand, and refusals of nonsense."""

from __future__ import annotations

import math

import pytest

from b300.training.mfu import mfu_from_tflops, model_flops_utilization, training_flops
from b300.training.thresholds import B300_DENSE_BF16_FLOPS


def test_by_hand() -> None:
    # Llama-3-405B-like: 405e9 params, 16 nodes x 8 B300, 2.0e5 tokens/s:
    # 6 * 405e9 * 2e5 = 4.86e17 FLOP/s over 128 * 2.25e15 = 2.88e17 -> 1.6875 (above 1: wrong inputs)
    assert training_flops(405e9, 2e5) == pytest.approx(4.86e17)
    assert model_flops_utilization(405e9, 2e5, 128, B300_DENSE_BF16_FLOPS) == pytest.approx(1.6875)
    # 8B model, one node, 1.5e5 tokens/s: 6 * 8e9 * 1.5e5 = 7.2e15 over 8 * 2.25e15 = 1.8e16 -> 0.4
    assert model_flops_utilization(8_000_000_000, 150_000.0, 8, 2.25e15) == pytest.approx(0.4)
    assert model_flops_utilization(8e9, 0.0, 8, 2.25e15) == 0.0
    assert mfu_from_tflops(900.0, 2.25e15) == pytest.approx(0.4)


def test_the_default_peak_is_the_documented_dense_bf16_figure() -> None:
    assert B300_DENSE_BF16_FLOPS == 2.25e15


@pytest.mark.parametrize(("args", "what"), [
    ((0, 1.0, 8, 1e15), "params must be a positive"),
    ((-5, 1.0, 8, 1e15), "params must be a positive"),
    ((math.nan, 1.0, 8, 1e15), "params must be a positive"),
    ((1e9, -1.0, 8, 1e15), "tokens_per_s must be a finite number >= 0"),
    ((1e9, math.inf, 8, 1e15), "tokens_per_s must be"),
    ((1e9, 1.0, 0, 1e15), "gpus must be a positive integer"),
    ((1e9, 1.0, True, 1e15), "gpus must be a positive integer"),
    ((1e9, 1.0, 8, 0.0), "peak_flops_per_gpu must be a positive"),
])
def test_nonsense_is_refused(args: tuple[float, float, int, float], what: str) -> None:
    with pytest.raises(ValueError, match=what):
        model_flops_utilization(*args)
