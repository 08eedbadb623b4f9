"""The job-log path: every Slurm filename pattern of sbatch's --output, expanded as
slurmstepd does for a batch job (the expected names were read off the files Slurm
22.05.8 wrote on the local cluster; tests/live/test_output_pattern_live.py checks
again against the running Slurm)."""

from __future__ import annotations

import pytest

from b300.slurm.script import expand_output_pattern


def _x(pattern: str, **kw: object) -> str:
    args: dict[str, object] = {"job_id": 7, "job_name": "b300-r1-a2", "user": "b300",
                               "batch_host": "gpu01.cluster.example"}
    args.update(kw)
    return expand_output_pattern(pattern, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("pattern", "expected"), [
    ("/logs/%x-%j.out", "/logs/b300-r1-a2-7.out"),              # the daemon's default
    ("/l/%%-%A-%a-%j-%J", "/l/%-7-4294967294-7-7"),             # not an array job
    ("/l/%N-%n-%s-%t-%u", "/l/gpu01-0-batch-0-b300"),           # the batch step, task 0
    ("/l/%5j-%3n-%3t-%3J", "/l/00007-000-000-007"),             # widths pad numbers
    ("/l/%20j", "/l/0000000007"),                               # at most 10 digits
    ("/l/%5x-%5u-%5N-%5s", "/l/b300-r1-a2-b300-gpu01-batch"),   # ...and not words
    ("/l/%b-%q", "/l/%b-%q"),                                   # unknown letters stay
    ("/l/%3%", "/l/3%"),
    ("/l/e\\%j-%x.out", "/l/e%j-%x.out"),                       # a backslash: no expansion
    ("/l/100%%", "/l/100%"),
    ("/l/%", "/l/%"),
])
def test_expansion(pattern: str, expected: str) -> None:
    assert _x(pattern) == expected


def test_array_ids() -> None:
    assert _x("/l/%A_%a", array_job_id=5, array_task_id=3) == "/l/5_3"
    assert _x("/l/%4a", array_job_id=5, array_task_id=3) == "/l/0003"


def test_no_batch_host() -> None:
    assert _x("/l/%N.out", batch_host="") == "/l/.out"
