"""Real jobs through a real b300d on the real local Slurm cluster.

Each recorded state, exit code and node list is compared with what sacct
itself says about the same job.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from b300.slurm.parse import expand_nodes
from helpers import DaemonHandle, gated_command, make_daemon, slurm_cmd, wait_for, write_spec

pytestmark = pytest.mark.slurm


def sacct_job(conf: str, job_id: int) -> dict[str, str]:
    """Wait until slurmdbd has the job's final record and return it."""

    def _read() -> dict[str, str] | None:
        out = slurm_cmd(
            conf,
            "sacct",
            "-X",
            "-n",
            "-P",
            f"-j{job_id}",
            "--format=State,ExitCode,NodeList,JobName",
        )
        if not out.strip():
            return None
        state, code, nodes, name = out.strip().splitlines()[-1].split("|")
        return {"state": state.split()[0], "exit": code, "nodes": nodes, "name": name}

    return dict(wait_for(_read, 60, f"sacct to know job {job_id}"))


def test_completed_job_matches_sacct(daemon: DaemonHandle, tmp_path: Path) -> None:
    run_id = daemon.submit(write_spec(tmp_path / "ok.toml", "ok", "srun hostname; sleep 1"))
    status = daemon.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"})
    assert status["run"]["state"] == "COMPLETED"
    [attempt] = status["attempts"]
    acct = sacct_job(daemon.slurm_conf, attempt["job_id"])
    assert acct["state"] == attempt["state"] == "COMPLETED"
    assert acct["exit"] == f"{attempt['exit_code']}:{attempt['signal']}" == "0:0"
    assert tuple(attempt["nodes"]) == expand_nodes(acct["nodes"])
    assert acct["name"] == attempt["tag"] == f"b300-{run_id}-a1"
    kinds = [e["kind"] for e in status["events"]]
    assert kinds[:3] == ["run.created", "attempt.intent", "attempt.submitted"]
    assert "attempt.state" in kinds


def test_failed_job_keeps_its_exit_code(daemon: DaemonHandle, tmp_path: Path) -> None:
    run_id = daemon.submit(write_spec(tmp_path / "bad.toml", "bad", "echo boom; exit 7"))
    status = daemon.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"})
    [attempt] = status["attempts"]
    acct = sacct_job(daemon.slurm_conf, attempt["job_id"])
    assert status["run"]["state"] == "FAILED"
    assert acct["state"] == attempt["state"] == "FAILED"
    assert acct["exit"] == "7:0" and attempt["exit_code"] == 7


def test_cancelled_job(daemon: DaemonHandle, tmp_path: Path) -> None:
    run_id = daemon.submit(write_spec(tmp_path / "long.toml", "long", "sleep 300"))
    daemon.wait_run(run_id, {"RUNNING"})
    proc = daemon.ctl_raw("cancel", run_id)
    assert proc.returncode == 0, proc.stderr
    status = daemon.wait_run(run_id, {"CANCELLED", "FAILED", "COMPLETED"})
    [attempt] = status["attempts"]
    assert status["run"]["state"] == "CANCELLED"
    assert sacct_job(daemon.slurm_conf, attempt["job_id"])["state"] == "CANCELLED"
    cancel = [e for e in status["events"] if e["kind"] == "run.cancel"]
    assert cancel and cancel[0]["actor"] == "root"


def test_multi_node_job_records_every_node(daemon: DaemonHandle, tmp_path: Path) -> None:
    run_id = daemon.submit(write_spec(tmp_path / "mn.toml", "multi", "srun hostname", nodes=2))
    status = daemon.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"})
    [attempt] = status["attempts"]
    assert status["run"]["state"] == "COMPLETED"
    assert len(attempt["nodes"]) == 2
    assert tuple(attempt["nodes"]) == expand_nodes(
        sacct_job(daemon.slurm_conf, attempt["job_id"])["nodes"]
    )


def test_resubmit_excludes_nodes(daemon: DaemonHandle, tmp_path: Path) -> None:
    run_id = daemon.submit(write_spec(tmp_path / "x.toml", "excl", "exit 3", nodes=1))
    daemon.wait_run(run_id, {"FAILED"})
    # A path with a space, to be passed on quoted. It must exist; the spec names no
    # checkpoint folder to verify it against, so --force.
    ckpt = tmp_path / "ckpt" / "step 10"
    ckpt.mkdir(parents=True)
    proc = daemon.ctl_raw(
        "resubmit", run_id, "--exclude", "gpu[01-03]", "--from-checkpoint", str(ckpt), "--force"
    )
    assert proc.returncode == 0, proc.stderr
    status = daemon.wait_run(run_id, {"FAILED", "COMPLETED"})
    wait_for(
        lambda: (
            len((s := daemon.run(run_id))["attempts"]) == 2
            and s["attempts"][1]["state"] == "FAILED"
        ),
        60,
        "attempt 2 to end",
    )
    second = daemon.run(run_id)["attempts"][1]
    assert second["excluded_nodes"] == ["gpu01", "gpu02", "gpu03"]
    assert second["nodes"] == ["gpu04"]
    assert second["resume_from"] == str(ckpt)
    assert status["run"]["attempts"] >= 1


def test_restart_mid_run_loses_and_duplicates_nothing(tmp_path: Path, slurm_conf: str) -> None:
    d = make_daemon(tmp_path, slurm_conf)
    d.start()
    try:
        # Each job runs until the test releases it: under load three submissions took
        # 5-10 s each and "sleep 20" jobs were never all RUNNING at one sample.
        gates = [tmp_path / f"go{i}" for i in range(3)]
        runs = [
            d.submit(write_spec(tmp_path / f"r{i}.toml", f"restart{i}", gated_command(gates[i])))
            for i in range(3)
        ]
        wait_for(
            lambda: sorted(r["state"] for r in d.ctl("status", "--all") if r["id"] in runs)
            == ["RUNNING"] * 3, 120, "all runs RUNNING",
        )
        d.kill(signal.SIGKILL)
        # One job ends while no daemon watches; the restarted one must learn it from Slurm.
        gates[0].touch()
        job0 = str(d.ctl("status", runs[0])["attempts"][0]["job_id"])
        wait_for(lambda: not slurm_cmd(slurm_conf, "squeue", "-h", f"-j{job0}", "-o", "%T").strip(),
                 120, f"job {job0} to leave the queue")
        d.start()
        for gate in gates[1:]:
            gate.touch()
        for r in runs:
            status = d.wait_run(r, {"COMPLETED", "FAILED", "CANCELLED"})
            assert status["run"]["state"] == "COMPLETED"
            [attempt] = status["attempts"]
            names = slurm_cmd(
                slurm_conf,
                "sacct",
                "-X",
                "-n",
                "-P",
                "--format=JobID",
                f"--name={attempt['tag']}",
                "-S",
                "now-1hour",
            ).split()
            assert names == [str(attempt["job_id"])]
    finally:
        for gate in gates:
            gate.touch()
        d.cleanup()


@pytest.mark.parametrize("point", ["before_sbatch", "after_sbatch"])
def test_crash_around_sbatch_submits_exactly_once(
    tmp_path: Path, slurm_conf: str, point: str
) -> None:
    d = make_daemon(tmp_path, slurm_conf)
    d.start(extra_env={"B300_CRASH_AT": point})
    proc = d.ctl_raw("submit", str(write_spec(tmp_path / "c.toml", "crash", "sleep 2")))
    assert proc.returncode == 5, proc.stderr  # the daemon died mid-request
    assert d.proc is not None and d.proc.wait(30) == -signal.SIGKILL
    d.start()
    try:
        [run] = d.ctl("status", "--all")
        status = d.wait_run(run["id"], {"COMPLETED", "FAILED", "CANCELLED"})
        assert status["run"]["state"] == "COMPLETED"
        [attempt] = status["attempts"]
        jobs = slurm_cmd(
            slurm_conf,
            "sacct",
            "-X",
            "-n",
            "-P",
            "--format=JobID",
            f"--name={attempt['tag']}",
            "-S",
            "now-1hour",
        ).split()
        assert jobs == [str(attempt["job_id"])]
        kinds = {e["kind"] for e in status["events"]}
        assert ("attempt.adopted" in kinds) == (point == "after_sbatch")
    finally:
        d.cleanup()


def test_daemon_on_postgresql(tmp_path: Path, slurm_conf: str, pg_url: str) -> None:
    d = make_daemon(tmp_path, slurm_conf, database_url=pg_url)
    d.start()
    try:
        run_id = d.submit(write_spec(tmp_path / "pg.toml", "pg", "srun hostname", nodes=2))
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"})
        assert status["run"]["state"] == "COMPLETED"
        assert len(status["attempts"][0]["nodes"]) == 2
    finally:
        d.cleanup()
