"""The same scenarios through both Slurm backends.

``cli`` runs against the real local cluster. ``pyslurm`` runs its real worker
process over the stand-in generated from pyslurm 25.11.2's Cython sources
(tests/pyslurm_standin.py): pyslurm's objects are replaced only at pyslurm's
own boundary, by values recorded from the same live jobs and nodes, under
the field names pyslurm's source gives them:

- ``pyslurm.Job`` (pyslurm/core/job/job.pyx): what ``scontrol show job``
  prints, which is the same ``slurm_job_info_t`` (JobState -> ``state``,
  NodeList -> ``allocated_nodes``, Reason -> ``state_reason``, ...);
- ``pyslurm.db.Job`` (pyslurm/db/job.pyx): what sacct prints for the job,
  with ``exit_code``/``exit_code_signal`` as pyslurm's ``_get_exit_code``
  (pyslurm/utils/helpers.pyx) derives them from the wait status;
- ``pyslurm.Node`` (pyslurm/core/node.pyx): ``scontrol show node``'s State,
  which is ``slurm_node_state_string_complete()``, the function pyslurm's
  ``Node.state`` calls (``IDLE+DRAIN``).

No Slurm 25.11 exists here, so no pyslurm call has run against a live Slurm.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from b300.errors import SlurmError
from b300.model import JobObservation, SubmitRequest
from b300.slurm.cli import CliSlurmClient
from b300.slurm.parse import expand_nodes, parse_time
from b300.slurm.pyslurm_backend import PyslurmClient
from helpers import slurm_cmd, wait_for
from pyslurm_standin import Boundary, install

pytestmark = pytest.mark.slurm

_KV = re.compile(r"(\w[\w/:]*)=(.*?)(?= \w[\w/:]*=|$)")


def _fields(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _KV.finditer(text.strip())}


def _epoch(raw: str) -> int | None:
    t = parse_time(raw)
    return int(t.timestamp()) if t else None


def _pyslurm_exit(raw: str) -> tuple[int, int]:
    """sacct's ``EXIT:SIG`` as pyslurm's ``_get_exit_code`` gives it (helpers.pyx)."""
    code, sig = (int(x) for x in raw.split(":"))
    if sig:
        return 0, sig
    return (code - 128 if code >= 128 else code), 0


def record_job(conf: str, job_id: int) -> dict[str, Any]:
    """A live job as a recorded ``pyslurm.Job``."""
    f = _fields(slurm_cmd(conf, "scontrol", "show", "job", "-o", str(job_id)))
    return {"id": int(f["JobId"]), "name": f["JobName"], "state": f["JobState"],
            "state_reason": f["Reason"],
            "allocated_nodes": None if f["NodeList"] == "(null)" else f["NodeList"],
            "start_time": _epoch(f["StartTime"]), "end_time": _epoch(f["EndTime"]),
            "requeue_count": int(f["Restarts"]), "comment": f.get("Comment", "")}


def record_db_job(conf: str, job_id: int) -> dict[str, Any]:
    """A job in slurmdbd as a recorded ``pyslurm.db.Job``."""
    out = slurm_cmd(conf, "sacct", "-X", "-n", "-P", f"-j{job_id}",
                    "--format=JobIDRaw,JobName,State,ExitCode,NodeList,Start,End,Reason")
    jid, name, state, code, nodes, start, end, reason = out.strip().splitlines()[-1].split("|")
    ec, sig = _pyslurm_exit(code)
    return {"id": int(jid), "name": name, "state": state.split()[0], "exit_code": ec,
            "exit_code_signal": sig, "nodelist": nodes, "start_time": _epoch(start),
            "end_time": _epoch(end), "state_reason": reason, "requeue_count": 0}


def record_nodes(conf: str) -> list[dict[str, Any]]:
    out = slurm_cmd(conf, "scontrol", "show", "node", "-o")
    rows = []
    for line in out.splitlines():
        f = _fields(line)
        # scontrol prints "reason [user@time]"; pyslurm has those apart (Node.reason,
        # Node.reason_user, Node.reason_time).
        reason = re.sub(r" \[[^\]@]+@[^\]]+\]$", "", f["Reason"]) if "Reason" in f else None
        rows.append({"name": f["NodeName"], "state": f["State"], "reason": reason})
    return rows


def _same(o: JobObservation) -> tuple[Any, ...]:
    return (o.job_id, o.state, o.name, o.nodes, o.reason, o.start, o.end, o.exit_code, o.signal,
            o.source)


@pytest.fixture
def backends(slurm_conf: str, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> Iterator[tuple[CliSlurmClient, PyslurmClient, Boundary]]:
    for var in ("LC_ALL", "SLURM_TIME_FORMAT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    boundary = install(monkeypatch, tmp_path)
    cli = CliSlurmClient(slurm_conf=slurm_conf)
    pys = PyslurmClient(slurm_conf=slurm_conf, timeout=60, fallback=cli)
    yield cli, pys, boundary
    pys.close()
    for line in slurm_cmd(slurm_conf, "squeue", "-h", "-o", "%i|%j").splitlines():
        jid, name = line.split("|", 1)
        if name.startswith("parity-"):
            slurm_cmd(slurm_conf, "scancel", jid)
    for row in record_nodes(slurm_conf):
        if "DRAIN" in row["state"] or "DOWN" in row["state"]:
            slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={row['name']}", "State=RESUME")


def _request(tmp_path: Path, name: str, body: str, **kw: Any) -> SubmitRequest:
    script = ("#!/bin/bash\n"
              f"env | sort > {tmp_path}/env-$SLURM_JOB_ID.txt\n"
              f"{body}\n")
    args: dict[str, Any] = {"job_name": name, "comment": "parity", "script": script, "nodes": 1,
                            "gpus_per_node": 8, "partition": "batch", "time_limit": "00:10:00",
                            "output": f"{tmp_path}/out-%j.txt", "workdir": str(tmp_path)}
    args.update(kw)
    return SubmitRequest(**args)


def _env(tmp_path: Path, job_id: int) -> dict[str, str]:
    path = tmp_path / f"env-{job_id}.txt"
    wait_for(path.exists, 60, f"job {job_id} to write its environment")
    text = wait_for(lambda: path.read_text() if path.read_text().endswith("\n") else "", 10,
                    "the whole environment")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_submit_environment_tasks_gpus_partition_exclude(
        backends: tuple[CliSlurmClient, PyslurmClient, Boundary], slurm_conf: str, tmp_path: Path) -> None:
    cli, pys, boundary = backends
    req = _request(tmp_path, "parity-submit", "sleep 60", nodes=2, ntasks_per_node=2,
                   excluded_nodes=("gpu04",))
    job_id = cli.submit(req)
    live = _fields(slurm_cmd(slurm_conf, "scontrol", "show", "job", "-o", str(job_id)))
    env = _env(tmp_path, job_id)

    pys.submit(req)
    [[_, desc]] = [e for e in boundary.journal() if e[0] == "submit"]

    # The job's environment: sbatch's additions, none of the cli tools' settings.
    assert "SLURM_TIME_FORMAT" not in env and "LC_ALL" not in env
    assert "SLURM_TIME_FORMAT" not in desc["environment"] and "LC_ALL" not in desc["environment"]
    for var in ("SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST"):
        assert desc["environment"][var] == env[var], var
    assert env["PATH"] == desc["environment"]["PATH"]
    # Tasks, GPUs, partition, excluded nodes: what slurmctld recorded for the cli job.
    assert int(live["NumTasks"]) == desc["ntasks"] == 4
    assert desc["ntasks_per_node"] == 2
    gres = ",".join(f"gres:gpu:{n}" for n in desc["gres_per_node"].values())  # cstr.from_gres_dict
    assert live["TresPerNode"].replace("/", ":") == gres
    assert live["Partition"] == desc["partitions"] == "batch"
    assert expand_nodes(live["ExcNodeList"]) == tuple(desc["excluded_nodes"]) == ("gpu04",)
    assert live["NumNodes"].split("-")[0] == str(desc["nodes"])


def test_jobs_accounting_since_and_find_by_name(
        backends: tuple[CliSlurmClient, PyslurmClient, Boundary], slurm_conf: str, tmp_path: Path) -> None:
    cli, pys, boundary = backends
    before = datetime.now(UTC) - timedelta(seconds=5)
    name = f"parity-exit3-{uuid.uuid4().hex[:8]}"
    running = cli.submit(_request(tmp_path, "parity-jobs", "sleep 60"))
    aborted = cli.submit(_request(tmp_path, "parity-abort", "kill -ABRT $$"))
    failed = cli.submit(_request(tmp_path, name, "exit 3"))
    wait_for(lambda: cli.jobs([running]).get(running, None) and cli.jobs([running])[running].start,
             60, "the job to start")
    # slurmdbd may hold a job's record briefly with the name "allocation": wait for the whole record.
    wait_for(lambda: len(cli.accounting([aborted, failed])) == 2 and all(
        o.state.is_terminal and o.end and o.name.startswith("parity-")
        for o in cli.accounting([aborted, failed]).values()),
        90, "both jobs to be accounted")
    live_cli = cli.jobs([running])
    boundary.set(jobs=[record_job(slurm_conf, running)],
                 db_jobs=[record_db_job(slurm_conf, j) for j in (aborted, failed)])
    live_pys = pys.jobs([running])
    assert _same(live_pys[running]) == _same(live_cli[running])

    acct_cli, acct_pys = cli.accounting([aborted, failed]), pys.accounting([aborted, failed])
    assert {j: _same(o) for j, o in acct_pys.items()} == {j: _same(o) for j, o in acct_cli.items()}
    assert (acct_cli[aborted].exit_code, acct_cli[aborted].signal) == (0, 6)
    assert (acct_cli[failed].exit_code, acct_cli[failed].signal) == (3, 0)
    # Every accounting filter names a start (slurmdbd's default is today's midnight).
    assert all(e[1].get("start_time") for e in boundary.journal() if e[0] == "db.Jobs.load")

    # find_by_name: the controller's view first, then accounting since ``since``.
    boundary.set(jobs=[record_job(slurm_conf, failed)], db_jobs=[record_db_job(slurm_conf, failed)])
    end = acct_cli[failed].end
    assert end is not None
    after = end + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) > after + timedelta(seconds=1), 5, "a second past the end")
    for since in (before, after):
        by_cli = cli.find_by_name(name, since=since)
        by_pys = pys.find_by_name(name, since=since)
        assert [_same(o) for o in by_pys] == [_same(o) for o in by_cli], since
    # since reaches slurmdbd's filter (not its midnight default): a job that ended
    # before ``since`` is not in accounting's answer.
    boundary.set(jobs=[], db_jobs=[record_db_job(slurm_conf, failed)])
    assert [o.job_id for o in pys.find_by_name(name, since=before)] == [failed]
    assert pys.find_by_name(name, since=after) == []
    assert boundary.journal()[-1] == ["db.Jobs.load", {"names": [name],
                                                        "start_time": int(after.timestamp())}]


def test_cancel_with_a_signal_reaches_the_batch_script(
        backends: tuple[CliSlurmClient, PyslurmClient, Boundary], slurm_conf: str, tmp_path: Path) -> None:
    cli, pys, boundary = backends
    flag = tmp_path / "got-usr1"
    ready = tmp_path / "trap-set"
    body = (f"trap 'echo USR1 > {flag}; exit 0' USR1\n"
            f"touch {ready}\n"
            "for i in $(seq 600); do sleep 0.1; done")
    job_id = cli.submit(_request(tmp_path, "parity-signal", body))
    wait_for(ready.exists, 60, "the batch script to set its trap")
    cli.cancel(job_id, signal="USR1", batch_only=True)
    wait_for(flag.exists, 30, "the batch script to get SIGUSR1")
    pys.cancel(job_id, signal="USR1", batch_only=True)
    assert [e for e in boundary.journal() if e[0] == "send_signal"] == [
        ["send_signal", job_id, 10, "batch"]]


def test_nodes_drain_and_resume(
        backends: tuple[CliSlurmClient, PyslurmClient, Boundary], slurm_conf: str, tmp_path: Path) -> None:
    cli, pys, boundary = backends
    # gpu03 busy, then drained: DRAINING (MIXED+DRAIN or ALLOCATED+DRAIN); gpu04 idle, drained: DRAINED.
    job_id = cli.submit(_request(tmp_path, "parity-busy", "sleep 60", nodes=1,
                                 excluded_nodes=("gpu01", "gpu02", "gpu04")))
    wait_for(lambda: cli.jobs([job_id]).get(job_id) and cli.jobs([job_id])[job_id].nodes == ("gpu03",),
             60, "the job to run on gpu03")
    cli.drain_node("gpu03", "parity\n  draining   test")
    pys.drain_node("gpu04", "parity\n  drained   test")
    [[_, node, changes]] = [e for e in boundary.journal() if e[0] == "modify_node"]
    assert (node, changes) == ("gpu04", {"state": "DRAIN", "reason": "parity drained test"})
    slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu04", "State=DRAIN",
              f"Reason={changes['reason']}")
    slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=DOWN", "Reason=parity down")
    boundary.set(nodes=record_nodes(slurm_conf))
    by_cli = {n.name: n for n in cli.nodes()}
    by_pys = {n.name: n for n in pys.nodes()}
    assert by_pys == by_cli
    assert (by_cli["gpu03"].state, by_cli["gpu03"].reason) == ("DRAINING", "parity draining test")
    assert (by_cli["gpu04"].state, by_cli["gpu04"].reason) == ("DRAINED", "parity drained test")
    assert (by_cli["gpu02"].state, by_cli["gpu02"].reason) == ("DOWN", "parity down")
    slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=RESUME")

    cli.resume_node("gpu04")
    pys.resume_node("gpu03")
    assert [e for e in boundary.journal() if e[0] == "modify_node"][-1] == [
        "modify_node", "gpu03", {"state": "RESUME"}]
    with pytest.raises(SlurmError):
        pys.drain_node("gpu01;reboot", "x")
    with pytest.raises(SlurmError):
        cli.drain_node("gpu01;reboot", "x")


def test_exclude_update_sets_and_clears(
        backends: tuple[CliSlurmClient, PyslurmClient, Boundary], slurm_conf: str, tmp_path: Path) -> None:
    cli, pys, boundary = backends
    # Held from the start (a hold sent after sbatch loses to the scheduler on a busy machine):
    # exclusions are changed on a pending job.
    job_id = int(slurm_cmd(slurm_conf, "sbatch", "--parsable", "--hold", "-J", "parity-exclude",
                           "-p", "batch", "-t", "00:10:00", "-o", f"{tmp_path}/out-%j.txt",
                           "--wrap", "sleep 1").split(";")[0])

    def exc() -> tuple[str, ...]:
        f = _fields(slurm_cmd(slurm_conf, "scontrol", "show", "job", "-o", str(job_id)))
        return expand_nodes(f["ExcNodeList"])

    cli.exclude_nodes(job_id, ["gpu02", "gpu01"])
    assert exc() == ("gpu01", "gpu02")
    pys.exclude_nodes(job_id, ["gpu02", "gpu01"])
    assert [e for e in boundary.journal() if e[0] == "modify_job"] == [
        ["modify_job", job_id, {"excluded_nodes": ["gpu02", "gpu01"]}]]
    # An empty list clears: pyslurm cannot say "" (fmalloc makes it NULL, "no change"),
    # so the pyslurm backend clears through scontrol, on the live cluster.
    pys.exclude_nodes(job_id, [])
    assert exc() == ()
    cli.exclude_nodes(job_id, ["gpu03"])
    cli.exclude_nodes(job_id, [])
    assert exc() == ()
    slurm_cmd(slurm_conf, "scancel", str(job_id))


def _broken_conf(slurm_conf: str, tmp_path: Path, key: str) -> str:
    """A copy of the cluster's config whose ``key`` port has nobody listening."""
    src = Path(slurm_conf).parent
    dst = tmp_path / "etc-broken"
    shutil.copytree(src, dst)
    conf = dst / "slurm.conf"
    conf.write_text(re.sub(rf"^{key}=\d+", f"{key}=9", conf.read_text(), flags=re.M))
    return str(conf)


def test_outages_are_transient_refusals_are_not(
        backends: tuple[CliSlurmClient, PyslurmClient, Boundary], slurm_conf: str, tmp_path: Path) -> None:
    cli, pys, boundary = backends
    no_ctld = CliSlurmClient(slurm_conf=_broken_conf(slurm_conf, tmp_path / "a", "SlurmctldPort"),
                             timeout=60)
    no_dbd = CliSlurmClient(slurm_conf=_broken_conf(slurm_conf, tmp_path / "b", "AccountingStoragePort"),
                            timeout=60)
    boundary.set(errors={"Jobs.load": "Unable to contact slurm controller (connect failure)",
                         "db.Jobs.load": "Failed to get Jobs from slurmdbd",
                         "submit": "Invalid partition name specified"})
    for name, call_cli, call_pys in (
        ("controller down", lambda: no_ctld.jobs([1]), lambda: pys.jobs([1])),
        ("slurmdbd down", lambda: no_dbd.accounting([1]), lambda: pys.accounting([1])),
    ):
        with pytest.raises(SlurmError) as by_cli:
            call_cli()
        with pytest.raises(SlurmError) as by_pys:
            call_pys()
        assert by_cli.value.transient and by_pys.value.transient, (name, by_cli.value, by_pys.value)
    bad = _request(tmp_path, "parity-refused", "true", partition="nosuchpartition")
    with pytest.raises(SlurmError) as by_cli:
        cli.submit(bad)
    with pytest.raises(SlurmError) as by_pys:
        pys.submit(bad)
    assert not by_cli.value.transient and not by_pys.value.transient
    # A row whose state cannot be read is skipped, not fatal, as the cli skips a line.
    boundary.set(jobs=[{**_row(7), "state": "NO_SUCH_STATE"}, _row(8)])
    assert list(pys.jobs([7, 8])) == [8]


def _row(job_id: int) -> dict[str, Any]:
    return {"id": job_id, "name": "parity-x", "state": "PENDING", "state_reason": "Priority",
            "allocated_nodes": None, "start_time": None, "end_time": None, "requeue_count": 0,
            "comment": ""}
