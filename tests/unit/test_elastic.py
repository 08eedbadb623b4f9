"""Elastic runs (issue 33): the [elastic] table, the batch script, the daemon's decision."""

from __future__ import annotations

import shlex

import pytest

from b300.elastic.members import JOINED, LEFT, FallBack, MemberLeft, Nothing, StartAgent, decide
from b300.errors import SpecError
from b300.slurm.script import build_request
from b300.spec import dump_spec, elastic_argv, parse_spec

BASE = """name = "el"
[job]
command = "train.py --steps 40 --out '/data/a b'"
nodes = 2
spare_nodes = 1
gpus_per_node = 0
"""
ELASTIC = """
[elastic]
min_nodes = 1
max_nodes = 2
max_restarts = 2
port = 29555
"""


def _spec(extra: str = ELASTIC, base: str = BASE):
    return parse_spec(base + extra, where="s.toml")


def test_an_elastic_spec_round_trips_and_splits_its_command() -> None:
    spec = _spec()
    assert spec.elastic is not None and spec.elastic.max_restarts == 2
    assert parse_spec(dump_spec(spec)) == spec
    assert elastic_argv(spec) == ["train.py", "--steps", "40", "--out", "/data/a b"]


@pytest.mark.parametrize(("extra", "base", "words"), [
    ("\n[elastic]\nmin_nodes = 3\nmax_nodes = 2\n", BASE, "min_nodes (3) is more than max_nodes (2)"),
    ("\n[elastic]\nmin_nodes = 3\nmax_nodes = 4\n", BASE, "nodes (2) must be within"),
    ("\n[elastic]\nmin_nodes = 1\nmax_nodes = 2\non_no_spare = \"pray\"\n", BASE, "on_no_spare"),
    ("\n[elastic]\nmin_nodes = 1\nmax_nodes = 2\nport = 80\n", BASE, "port"),
    (ELASTIC, BASE.replace("train.py", "torchrun train.py"), "remove torchrun"),
    (ELASTIC, BASE.replace("train.py --steps", "train.py 'x --steps"), "cannot be split"),
    (ELASTIC, BASE + "ntasks_per_node = 2\n", "nproc_per_node"),
])
def test_a_wrong_elastic_spec_is_one_line(extra: str, base: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        _spec(extra, base)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_batch_script_runs_the_host_with_no_kill_and_the_spares() -> None:
    req = build_request(_spec(), run_id="el-1", attempt=1, log_dir="/var/log/b300 jobs")
    assert req.no_kill and req.nodes == 3
    last = next(line for line in req.script.splitlines() if line.startswith("exec "))
    words = shlex.split(last)
    assert words[2:4] == ["-m", "b300.elastic.host"]
    assert words[words.index("--dir") + 1] == "/var/log/b300 jobs/launch/b300-el-1-a1"
    assert words[words.index("--") + 1:] == ["train.py", "--steps", "40", "--out", "/data/a b"]
    assert [words[words.index(k) + 1] for k in ("--nodes", "--min-nodes", "--max-nodes",
                                                 "--max-restarts", "--port")] == ["2", "1", "2", "2", "29555"]


ALLOC = ["n1", "n2", "n3"]


def test_a_lost_member_is_replaced_by_the_spare() -> None:
    acts = decide(_spec(), node="n2", allocation=ALLOC, batch_host="n1", history=[])
    assert acts == [MemberLeft("n2", ("n1",), 1, "replace"),
                    StartAgent("n3", generation=1, replaces="n2", add=("n3",), members=("n1", "n3"),
                               spares_left=0)]


def test_with_no_spare_it_shrinks_or_falls_back_as_declared() -> None:
    history = [(LEFT, {"node": "n2"}), (JOINED, {"node": "n3"})]
    acts = decide(_spec(), node="n3", allocation=ALLOC, batch_host="n1", history=history)
    assert acts == [MemberLeft("n3", ("n1",), 2, "shrink")]
    resubmit = _spec(ELASTIC + 'on_no_spare = "resubmit"\n')
    acts = decide(resubmit, node="n3", allocation=ALLOC, batch_host="n1", history=history)
    assert isinstance(acts[-1], FallBack) and "resubmit" in acts[-1].why


def test_restarts_spent_batch_host_idle_spare_and_a_repeat() -> None:
    spec = _spec(ELASTIC.replace("max_restarts = 2", "max_restarts = 0"))
    assert isinstance(decide(spec, node="n2", allocation=ALLOC, batch_host="n1", history=[])[-1], FallBack)
    assert isinstance(decide(_spec(), node="n1", allocation=ALLOC, batch_host="n1", history=[])[-1],
                      FallBack)
    assert decide(_spec(), node="n3", allocation=ALLOC, batch_host="n1", history=[]) == [
        Nothing("n3 runs no agent of the run (an idle spare)")]
    again = decide(_spec(), node="n2", allocation=ALLOC, batch_host="n1", history=[(LEFT, {"node": "n2"})])
    assert len(again) == 1 and isinstance(again[0], Nothing) and again[0].already


def test_a_drained_spare_is_not_used_and_below_min_falls_back() -> None:
    acts = decide(_spec(), node="n2", allocation=ALLOC, batch_host="n1", history=[], unusable=["n3"])
    assert acts == [MemberLeft("n2", ("n1",), 1, "shrink")]
    spec2 = _spec(ELASTIC.replace("min_nodes = 1", "min_nodes = 2"))
    acts = decide(spec2, node="n2", allocation=ALLOC, batch_host="n1", history=[], unusable=["n3"])
    assert isinstance(acts[-1], FallBack) and "below min_nodes" in acts[-1].why
