"""The Slurm output parsers, on output captured from Slurm 22.05 (pure, no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b300.errors import SlurmError
from b300.model import SlurmState
from b300.slurm.parse import (
    expand_nodes,
    fold_nodes,
    parse_exit_code,
    parse_sacct,
    parse_sbatch,
    parse_sinfo,
    parse_squeue,
    parse_state,
    parse_time,
)

SACCT = """\
1|COMPLETED|0:0|gpu[01-02]|2026-11-29T19:05:52|2026-11-29T19:05:52|wrap|None
3|FAILED|1:0|None assigned|2026-11-29T19:05:51|2026-11-29T19:05:51|wrap|None
4|NODE_FAIL|0:0|gpu[01-02]|2026-11-29T19:06:01|2026-11-29T19:06:39|wrap|None
5|RUNNING|0:0|gpu[01-02]|2026-11-29T19:06:57|Unknown|wrap|None
6|CANCELLED by 0|0:15|gpu03|2026-11-29T19:07:00|2026-11-29T19:07:09|b300-x-a1|None
"""

SQUEUE = """\
4|CANCELLED||2026-11-29T19:06:57|2026-11-29T19:06:57|wrap|BeginTime
5|RUNNING|gpu[01-02]|2026-11-29T19:06:57|NONE|wrap|None
7|PENDING||N/A|N/A|b300-run-a1|Resources
8_3|PENDING||N/A|N/A|array|Priority
9|RUNNING|gpu04|2026-11-29T19:06:57|NONE|name|with|pipes|reason|has|pipes
"""


def test_sbatch_output() -> None:
    assert parse_sbatch("123\n") == 123
    assert parse_sbatch("456;b300local\n") == 456
    with pytest.raises(SlurmError):
        parse_sbatch("sbatch: error: Batch job submission failed\n")


def test_states_strip_flags_and_actor() -> None:
    assert parse_state("CANCELLED by 0") is SlurmState.CANCELLED
    assert parse_state("COMPLETED+") is SlurmState.COMPLETED
    with pytest.raises(ValueError):
        parse_state("EXPLODED")


def test_exit_codes() -> None:
    assert parse_exit_code("1:0") == (1, 0)
    assert parse_exit_code("0:15") == (0, 15)
    assert parse_exit_code("") == (None, None)
    assert parse_exit_code("x:y") == (None, None)


def test_times_are_utc() -> None:
    cet = timezone(__import__("datetime").timedelta(hours=1))
    assert parse_time("2026-11-29T19:00:00", cet) == datetime(2026, 11, 29, 18, 0, tzinfo=UTC)
    for empty in ("Unknown", "NONE", "N/A", "None", ""):
        assert parse_time(empty) is None


def test_sacct_lines() -> None:
    jobs, bad = parse_sacct(SACCT)
    assert not bad
    assert jobs[1].state is SlurmState.COMPLETED and jobs[1].nodes == ("gpu01", "gpu02")
    assert jobs[3].exit_code == 1 and jobs[3].nodes == ()
    assert jobs[4].state is SlurmState.NODE_FAIL
    assert jobs[5].end is None
    assert jobs[6].state is SlurmState.CANCELLED and jobs[6].signal == 15
    assert jobs[6].name == "b300-x-a1"


def test_squeue_lines_skip_arrays_and_keep_free_text_last() -> None:
    jobs, bad = parse_squeue(SQUEUE)
    assert not bad
    assert set(jobs) == {4, 5, 7, 9}
    assert jobs[7].reason == "Resources" and jobs[7].start is None
    assert jobs[9].name == "name" and jobs[9].reason == "with|pipes|reason|has|pipes"
    assert jobs[5].exit_code is None  # squeue never knows exit codes


def test_garbage_lines_are_reported_not_guessed() -> None:
    jobs, bad = parse_sacct("12|WHATEVER|0:0|gpu01|||x|y\nnot a line\n")
    assert jobs == {} and len(bad) == 2
    jobs, bad = parse_squeue("x|RUNNING|gpu01|||n|r\n12|RUNNING|gpu[01-|||n|r\n")
    assert jobs == {} and len(bad) == 2


def test_sinfo_nodes_deduplicated_with_flags() -> None:
    nodes, bad = parse_sinfo(
        "gpu01|mixed|none\ngpu02|down*|Not responding\ngpu02|down*|Not responding\n"
        "gpu03|drained|b300: run x failed|NCCL\n"
    )
    assert not bad
    assert [n.name for n in nodes] == ["gpu01", "gpu02", "gpu03"]
    assert nodes[1].state == "DOWN" and nodes[1].flags == ("*",)
    assert nodes[2].reason == "b300: run x failed|NCCL"


def test_hostlists() -> None:
    assert expand_nodes("gpu[01-03,07]") == ("gpu01", "gpu02", "gpu03", "gpu07")
    assert expand_nodes("None assigned") == ()
    assert fold_nodes(["gpu02", "gpu01", "gpu03"]) == "gpu[01-03]"
    with pytest.raises(ValueError):
        expand_nodes("gpu[01-")


@given(st.text(max_size=200))
def test_parsers_never_raise_on_any_text(text: str) -> None:
    parse_sacct(text)
    parse_squeue(text)
    parse_sinfo(text)
    parse_exit_code(text)
    parse_time(text)
