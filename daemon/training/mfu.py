"""Model FLOPs utilisation: the share of the GPUs' peak that the model's training used.

``MFU = 6 * N * tokens_per_s / (gpus * peak_flops_per_gpu)``: a dense transformer of
``N`` parameters costs about ``6 N`` FLOPs per token trained (2 N forward, 4 N
backward; attention's own FLOPs and activation recomputation are left out, as in the
usual definition of MFU). ``peak_flops_per_gpu`` comes from the config
(``[training.peak]``, default :data:`b300.training.thresholds.B300_DENSE_BF16_FLOPS`):
it is a property of the parts and the number format, not a constant of nature.

Where the job reports achieved TFLOP/s per GPU itself (Megatron's ``--log-throughput``,
which counts attention too), :func:`mfu_from_tflops` uses that figure instead.
"""

from __future__ import annotations

import math


def training_flops(params: float, tokens_per_s: float) -> float:
    """FLOP/s that training ``params`` parameters at ``tokens_per_s`` takes (6 N per token)."""
    _positive("params", params)
    _non_negative("tokens_per_s", tokens_per_s)
    return 6.0 * params * tokens_per_s


def model_flops_utilization(params: float, tokens_per_s: float, gpus: int,
                            peak_flops_per_gpu: float) -> float:
    """MFU as a fraction (0.42 is 42%). ValueError for a non-positive N, GPU count or peak,
    a negative rate or anything not finite. Not clipped at 1: above 1 the model size or the
    peak is configured wrong, which the caller should show rather than hide."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    _positive("peak_flops_per_gpu", peak_flops_per_gpu)
    return training_flops(params, tokens_per_s) / (gpus * peak_flops_per_gpu)


def mfu_from_tflops(tflops_per_gpu: float, peak_flops_per_gpu: float) -> float:
    """MFU from a job's own achieved TFLOP/s per GPU."""
    _non_negative("tflops_per_gpu", tflops_per_gpu)
    _positive("peak_flops_per_gpu", peak_flops_per_gpu)
    return tflops_per_gpu * 1e12 / peak_flops_per_gpu


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
