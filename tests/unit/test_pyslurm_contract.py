"""The pyslurm backend against pyslurm 25.11.2's own source.

Every call the backend makes is run, through its real worker process, against
the stand-in generated from the Cython sources of pyslurm's sdist
(tests/pyslurm_standin.py; the sdist is tests/fixtures/pyslurm-25.11.2.tar.gz).
An attribute, keyword, constructor field, signal name or node state that
pyslurm's source does not have fails here, as it would on a real Slurm 25.11.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from b300.errors import SlurmError
from b300.model import SlurmState, SubmitRequest
from b300.slurm.pyslurm_backend import PyslurmClient, _release_check
from pyslurm_standin import (
    CLASSES,
    EXPORTS,
    SDIST_SHA256,
    Boundary,
    StandIn,
    exported,
    install,
    read_sources,
    version,
)

T0 = 1_764_000_000


@pytest.fixture
def boundary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Boundary:
    monkeypatch.delenv("SLURM_TIME_FORMAT", raising=False)
    return install(monkeypatch, tmp_path)


@pytest.fixture
def client(boundary: Boundary) -> Iterator[PyslurmClient]:
    c = PyslurmClient(timeout=60)
    yield c
    c.close()


def _request() -> SubmitRequest:
    return SubmitRequest(
        job_name="b300-r1-a1", comment="b300 run r1", script="#!/bin/bash\necho hi\n", nodes=2,
        gpus_per_node=8, partition="batch", time_limit="01:00:00", account="acct", qos="normal",
        excluded_nodes=("gpu03", "gpu04"), output="/tmp/o-%j.txt", workdir="/tmp",
        ntasks_per_node=8, requeue=True,
    )


def test_the_sdist_is_pyslurm_25_11_2_and_exports_what_the_backend_imports() -> None:
    sources = read_sources()
    assert version(sources) == "25.11.2"
    assert SDIST_SHA256 and set(EXPORTS) <= set(CLASSES) | {"RPCError"}
    assert all(exported(sources, name) for name in EXPORTS)


def test_submit_sets_only_fields_of_JobSubmitDescription(client: PyslurmClient, boundary: Boundary) -> None:
    job_id = client.submit(_request())
    assert job_id == 1001
    [entry] = [e for e in boundary.journal() if e[0] == "submit"]
    desc = entry[1]
    assert desc["gres_per_node"] == {"gpu": 8} and desc["partitions"] == "batch"
    assert desc["ntasks"] == 16 and desc["ntasks_per_node"] == 8
    assert desc["excluded_nodes"] == ["gpu03", "gpu04"]
    env = desc["environment"]
    assert env["SLURM_SUBMIT_DIR"] and env["SLURM_SUBMIT_HOST"] and "SLURM_TIME_FORMAT" not in env


def test_jobs_reads_only_members_pyslurm_Job_has(
        client: PyslurmClient, boundary: Boundary) -> None:
    live = {"id": 7, "name": "b300-r1-a1", "state": "RUNNING", "state_reason": "None",
            "allocated_nodes": "gpu[01-02]", "start_time": T0, "end_time": None,
            "requeue_count": 0, "comment": "b300 run r1"}
    acct = {"id": 6, "name": "b300-r1-a1", "state": "FAILED", "state_reason": "None",
            "nodelist": "gpu03", "exit_code": 0, "exit_code_signal": 6, "start_time": T0 - 100,
            "end_time": T0 - 50, "requeue_count": 0}
    boundary.set(jobs=[live], db_jobs=[acct])
    seen = client.jobs([7])
    assert seen[7].state is SlurmState.RUNNING and seen[7].nodes == ("gpu01", "gpu02")
    assert seen[7].reason == ""


def test_accounting_and_find_by_name_read_only_members_pyslurm_db_has(
        client: PyslurmClient, boundary: Boundary) -> None:
    live = {"id": 7, "name": "b300-r1-a1", "state": "RUNNING", "state_reason": "None",
            "allocated_nodes": "gpu[01-02]", "start_time": T0, "end_time": None,
            "requeue_count": 0, "comment": "b300 run r1", "exit_code": 0, "exit_code_signal": 0}
    acct = {"id": 6, "name": "b300-r1-a1", "state": "FAILED", "state_reason": "None",
            "nodelist": "gpu03", "exit_code": 0, "exit_code_signal": 6, "start_time": T0 - 100,
            "end_time": T0 - 50, "requeue_count": 0, "comment": ""}
    boundary.set(jobs=[live], db_jobs=[acct])
    ended = client.accounting([6])
    assert (ended[6].exit_code, ended[6].signal, ended[6].source) == (0, 6, "sacct")
    found = client.find_by_name("b300-r1-a1", since=datetime.fromtimestamp(T0 - 200, UTC))
    assert [(o.job_id, o.source) for o in found] == [(6, "sacct"), (7, "squeue")]


def test_cancel_with_the_checkpoint_signal_uses_a_name_pyslurm_accepts(
        client: PyslurmClient, boundary: Boundary) -> None:
    client.cancel(7, signal="USR1", batch_only=True)
    client.cancel(7, signal="USR2", full=True)  # a spec's signal_to = "all"
    client.cancel(7)
    assert [e for e in boundary.journal() if e[0] in ("send_signal", "cancel")] == [
        ["send_signal", 7, 10, "batch"], ["send_signal", 7, 12, "all"], ["cancel", 7]]


def test_nodes_drain_resume_and_exclude_use_what_Node_and_Job_have(
        client: PyslurmClient, boundary: Boundary) -> None:
    boundary.set(nodes=[{"name": "gpu01", "state": "IDLE+DRAIN", "reason": "bad gpu"}])
    assert [(n.name, n.state, n.reason) for n in client.nodes()] == [("gpu01", "DRAINED", "bad gpu")]
    client.drain_node("gpu02", "xid 79\n on gpu 3")
    client.resume_node("gpu02")
    client.exclude_nodes(7, ["gpu03"])
    changes = [e for e in boundary.journal() if e[0] in ("modify_node", "modify_job")]
    assert changes == [
        ["modify_node", "gpu02", {"state": "DRAIN", "reason": "xid 79 on gpu 3"}],
        ["modify_node", "gpu02", {"state": "RESUME"}],
        ["modify_job", 7, {"excluded_nodes": ["gpu03"]}],
    ]


def test_partition_nodes_read_only_members_Partition_has(
        client: PyslurmClient, boundary: Boundary) -> None:
    boundary.set(partitions=[{"name": "batch", "nodes": "gpu[01-02]", "is_default": True},
                             {"name": "small", "nodes": "gpu03", "is_default": False}])
    assert client.partition_nodes(None) == ["gpu01", "gpu02"]
    assert client.partition_nodes("small") == ["gpu03"]
    with pytest.raises(SlurmError):
        client.partition_nodes("nope")
    assert client.default_partition() == "batch"
    boundary.set(partitions=[{"name": "small", "nodes": "gpu03", "is_default": False}])
    assert client.default_partition() is None


def test_auto_compares_the_controller_release_with_pyslurm_s(tmp_path: Path) -> None:
    standin = StandIn(tmp_path / "state.json")
    Boundary(standin.state_file).set(config={"version": "25.11.7"})
    assert _release_check(standin.module) == (True, "")
    Boundary(standin.state_file).set(config={"version": "24.11.1"})
    ok, why = _release_check(standin.module)
    assert not ok and "built for Slurm 25.11, the controller runs 24.11.1" in why


def test_a_member_pyslurm_lacks_is_refused_by_the_stand_in(client: PyslurmClient, boundary: Boundary) -> None:
    # The stand-in itself must be able to fail: a recording with a field that
    # pyslurm.Job does not have is refused, as is a submission field it lacks.
    boundary.set(jobs=[{"id": 7, "nodelist": "gpu01"}])
    with pytest.raises(SlurmError, match=r"'nodelist' is not a member of pyslurm\.Job"):
        client.jobs([7])
    standin = StandIn(boundary.state_file)
    with pytest.raises(AssertionError, match="no settable attribute 'gpus_per_node'"):
        standin.module.JobSubmitDescription(gpus_per_node=8)
    with pytest.raises(ValueError, match="Invalid Signal: USR1"):
        standin.module.Job(7).send_signal("USR1")


@pytest.mark.parametrize(("controller", "chosen"), [("25.11.7", "pyslurm"), ("24.11.1", "cli")])
def test_auto_takes_pyslurm_only_for_its_own_release_and_logs_it(
        boundary: Boundary, controller: str, chosen: str) -> None:
    from structlog.testing import capture_logs

    from b300.plugin_registry import PluginRegistry
    from b300.slurm import make_slurm_client

    boundary.set(config={"version": controller})
    plugins = PluginRegistry()
    with capture_logs() as logs:
        client = make_slurm_client("auto", slurm_conf=None, bin_dir=None, timeout=30, plugins=plugins)
    assert client.name == chosen
    [entry] = [e for e in logs if e["event"] == "slurm.backend"]
    assert entry["backend"] == chosen and entry["configured"] == "auto"
    if chosen == "cli":
        assert "built for Slurm 25.11, the controller runs 24.11.1" in entry["why"]
    assert make_slurm_client("cli", slurm_conf=None, bin_dir=None, timeout=30, plugins=plugins).name == "cli"
