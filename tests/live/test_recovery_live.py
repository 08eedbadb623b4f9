"""Failure recovery end to end: a real 2-node PyTorch job on the real cluster,
a real node failure (its slurmd and job processes killed), a real b300d.

Each test checks the run's outcome the way an operator would: the node's
state and reason in Slurm, the step the next attempt resumed at (from the
workload's own history file), the final step, and that never more than one
Slurm job of the run was active at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import CLUSTER, DaemonHandle, make_daemon, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parent.parent / "workload" / "train.py"
STEPS = 30


def _spec(tmp_path: Path, name: str, *train_args: str, hang_timeout: str = "30m",
          startup_timeout: str = "5m") -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    command = (f"srun {sys.executable} {TRAIN} --steps {STEPS} --ckpt-every 5 "
               f"--step-time 0.4 {' '.join(train_args)}")
    spec = tmp_path / f"{name}.toml"
    spec.write_text("\n".join([
        f'name = "{name}"', "[job]", f"command = {json.dumps(command)}", "nodes = 2",
        "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
        "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[health]", f'progress_file = "{run_dir / "progress.json"}"',
        f'hang_timeout = "{hang_timeout}"', f'startup_timeout = "{startup_timeout}"',
        "[retries]", "infra = 3",
    ]) + "\n")
    return spec


class JobCounter:
    """Samples squeue in the background: the most jobs of one run active at once."""

    def __init__(self, conf: str, run_id: str) -> None:
        self.conf, self.prefix, self.most = conf, f"b300-{run_id}-a", 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            out = slurm_cmd(self.conf, "squeue", "--noheader", "--format=%j|%T")
            active = [ln for ln in out.splitlines() if ln.startswith(self.prefix)]
            self.most = max(self.most, len(active))

    def __enter__(self) -> JobCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _kill_node(node: str, killed: list[str]) -> None:
    killed.append(node)
    subprocess.run(["bash", str(CLUSTER), "kill-node", node], check=True, timeout=60,
                   capture_output=True)


def _progress(tmp_path: Path) -> int:
    try:
        return int(json.loads((tmp_path / "run" / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _history(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _injected(tmp_path: Path) -> list[dict[str, Any]]:
    """What the workload's fault knobs did (``injected.jsonl`` beside the checkpoint folder)."""
    path = tmp_path / "run" / "injected.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _node_reason(conf: str, node: str) -> tuple[str, str]:
    out = slurm_cmd(conf, "sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T|%E")
    state, reason = out.strip().splitlines()[0].split("|", 1)
    return state, reason


def _start(tmp_path: Path, conf: str, env: dict[str, str] | None = None) -> DaemonHandle:
    d = make_daemon(tmp_path, conf, poll_interval="1s")
    d.start(extra_env=env)
    return d


def test_node_failure_drains_and_resumes_from_newest_checkpoint(
    tmp_path: Path, slurm_conf: str, fresh_nodes: list[str]
) -> None:
    d = _start(tmp_path, slurm_conf)
    try:
        # Attempt 1 waits after step 12 until the gate opens, so the node dies while it
        # trains (free-running, it ended before the kill beside a CPU hog).
        gate = tmp_path / "go"
        run_id = d.submit(_spec(tmp_path, "nodefail", "--pause-at", "12", "--gate", str(gate)))
        with JobCounter(slurm_conf, run_id) as counter:
            first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
            wait_for(lambda: _progress(tmp_path) >= 12, 120, "training to pass step 12")
            victim = first["nodes"][1]
            _kill_node(victim, fresh_nodes)
            gate.touch()  # rank 0 goes on and meets its dead peer, as without the pause
            wait_for(lambda: len(d.run(run_id)["attempts"]) >= 2, 150, "a second attempt")
            status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert status["run"]["state"] == "COMPLETED", status["events"][-5:]
        assert counter.most == 1
        a1, a2 = status["attempts"]
        assert victim in a2["excluded_nodes"] and victim not in a2["nodes"]
        assert a1["end"] <= a2["start"]
        state, reason = _node_reason(slurm_conf, victim)
        assert "drain" in state and run_id in reason, (state, reason)
        resumed = _history(tmp_path)[-1]
        step = int(Path(a2["resume_from"]).name.split("_")[1])
        assert resumed["attempt"] == 2 and resumed["start_step"] == step >= 10
        # Nothing newer was complete when the second attempt was submitted.
        ckpts = sorted((tmp_path / "run" / "ckpt").glob("step_*"))
        assert all(int(p.name.split("_")[1]) <= step or p.stat().st_mtime > _ts(a2["created_at"])
                   for p in ckpts if (p / ".metadata").exists())
        done = json.loads((tmp_path / "run" / "done.json").read_text())
        assert done == {"step": STEPS, "attempt": 2, "job_id": a2["job_id"]}
        kinds = [e["kind"] for e in status["events"]]
        assert "attempt.classified" in kinds and "node.drained" in kinds
        [classified] = [e for e in status["events"] if e["kind"] == "attempt.classified"]
        assert classified["data"]["outcome"] == "INFRA" and victim in classified["data"]["suspects"]
    finally:
        d.cleanup()


def test_torn_checkpoint_is_never_chosen(
    tmp_path: Path, slurm_conf: str, fresh_nodes: list[str]
) -> None:
    d = _start(tmp_path, slurm_conf)
    try:
        run_id = d.submit(_spec(tmp_path, "torn", "--torn-at", "15"))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        torn = tmp_path / "run" / "ckpt" / "step_000015"
        wait_for(lambda: (torn / "__0_0.distcp").exists(), 120, "rank 0's shard of step 15")
        assert not (torn / ".metadata").exists()
        _kill_node(first["nodes"][1], fresh_nodes)
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        assert status["run"]["state"] == "COMPLETED"
        a2 = status["attempts"][1]
        assert a2["resume_from"].endswith("step_000010")
        assert _history(tmp_path)[-1]["start_step"] == 10
        [resub] = [e for e in status["events"] if e["kind"] == "recovery.resubmit"]
        rejected = {c["path"] for c in resub["data"]["checkpoints_checked"] if not c["ok"]}
        assert str(torn) in rejected
    finally:
        d.cleanup()


def test_hung_job_is_cancelled_and_resubmitted(tmp_path: Path, slurm_conf: str) -> None:
    d = _start(tmp_path, slurm_conf)
    try:
        run_id = d.submit(_spec(tmp_path, "hang", "--hang-at", "12", hang_timeout="15s"))
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert status["run"]["state"] == "COMPLETED"
        a1, a2 = status["attempts"]
        assert a1["state"] == "CANCELLED"
        hang = [e for e in status["events"] if e["kind"] == "attempt.hang"]
        assert len(hang) == 1 and hang[0]["data"]["last_step"] == "12"
        assert a2["resume_from"].endswith("step_000010")
        assert _history(tmp_path)[-1]["start_step"] == 10
        assert not [e for e in status["events"] if e["kind"] == "node.drained"]
    finally:
        d.cleanup()


def test_daemon_killed_between_hang_record_and_cancel_cancels_once(tmp_path: Path, slurm_conf: str) -> None:
    """b300d dies (B300_CRASH_AT=hang_recorded) right after committing ``attempt.hang``, before
    its scancel. Restarted, it cancels the still-running job on its first cycles, not after
    another hang_timeout of timing the step from zero; the hang is recorded once and recovery
    submits one new attempt."""
    hang_timeout = 30
    hang_file = tmp_path / "hang-now"
    d = _start(tmp_path, slurm_conf, env={"B300_CRASH_AT": "hang_recorded"})
    try:
        run_id = d.submit(_spec(tmp_path, "hangcrash", "--hang-file", str(hang_file),
                                hang_timeout=f"{hang_timeout}s"))
        job = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]["job_id"]
        wait_for(lambda: _progress(tmp_path) >= 6, 120, "training to pass step 6")
        hang_file.touch()
        wait_for(lambda: d.proc is not None and d.proc.poll() is not None, hang_timeout + 150,
                 "b300d to die right after recording the hang")
        assert d.proc is not None and d.proc.returncode == -signal.SIGKILL
        # Killed between the two: the job was never cancelled and still runs.
        state = slurm_cmd(slurm_conf, "squeue", "--noheader", f"--jobs={job}", "--format=%T")
        assert state.strip() == "RUNNING"
        [hung_at] = [r["step"] for r in _injected(tmp_path) if r["what"] == "hang"]
        restarted = time.time()
        d.start()
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert status["run"]["state"] == "COMPLETED"
        a1, a2 = status["attempts"]
        assert a1["job_id"] == job and a1["state"] == "CANCELLED"
        # Cancelled by the restarted daemon before a new hang_timeout could have run out (Slurm's
        # end time is in whole seconds, hence the second).
        assert _ts(a1["end"]) < restarted + hang_timeout - 1, (a1["end"], restarted)
        hang = [e for e in status["events"] if e["kind"] == "attempt.hang"]
        assert len(hang) == 1 and hang[0]["data"]["last_step"] == str(hung_at)
        [classified] = [e for e in status["events"] if e["kind"] == "attempt.classified"]
        assert classified["data"]["outcome"] == "HANG"
        jobs = slurm_cmd(slurm_conf, "sacct", "-X", "-n", "-P", "--format=JobID",
                         f"--name={a2['tag']}", "-S", "now-1hour").split()
        assert jobs == [str(a2["job_id"])]
        assert json.loads((tmp_path / "run" / "done.json").read_text())["attempt"] == 2
    finally:
        d.cleanup()


def test_job_error_is_not_resubmitted(tmp_path: Path, slurm_conf: str) -> None:
    d = _start(tmp_path, slurm_conf)
    try:
        run_id = d.submit(_spec(tmp_path, "buggy", "--fail-at", "7"))
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        assert status["run"]["state"] == "FAILED"
        [a1] = status["attempts"]
        assert a1["state"] == "FAILED" and a1["exit_code"] == 1
        [classified] = [e for e in status["events"] if e["kind"] == "attempt.classified"]
        assert classified["data"]["outcome"] == "JOB_ERROR"
        assert any(e["kind"] == "recovery.stopped" for e in status["events"])
    finally:
        d.cleanup()


def test_daemon_killed_mid_recovery_submits_once(
    tmp_path: Path, slurm_conf: str, fresh_nodes: list[str]
) -> None:
    d = _start(tmp_path, slurm_conf, env={"B300_CRASH_AT": "after_sbatch_a2"})
    try:
        gate = tmp_path / "go"  # attempt 1 waits after step 8: the node dies while it trains
        run_id = d.submit(_spec(tmp_path, "crashy", "--pause-at", "8", "--gate", str(gate)))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        wait_for(lambda: _progress(tmp_path) >= 8, 120, "training to pass step 8")
        _kill_node(first["nodes"][1], fresh_nodes)
        gate.touch()  # attempt 1 is dead (its peer's node is); attempt 2 never pauses
        assert d.proc is not None
        wait_for(lambda: d.proc is not None and d.proc.poll() is not None, 150,
                 "b300d to die right after submitting attempt 2")
        d.start()
        status = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert status["run"]["state"] == "COMPLETED"
        _a1, a2 = status["attempts"]
        jobs = slurm_cmd(slurm_conf, "sacct", "-X", "-n", "-P", "--format=JobID",
                         f"--name={a2['tag']}", "-S", "now-1hour").split()
        assert jobs == [str(a2["job_id"])]
        assert any(e["kind"] == "attempt.adopted" for e in status["events"])
        assert json.loads((tmp_path / "run" / "done.json").read_text())["step"] == STEPS
    finally:
        d.cleanup()


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def test_daemon_fingerprints_checkpoints_and_flags_an_overdue_one(
    tmp_path: Path, slurm_conf: str
) -> None:
    """The checkpoint pass makes manifests of complete checkpoints while the run goes,
    and a run whose checkpoints stop coming gets the alert and a USR1 it can trap."""
    d = make_daemon(tmp_path, slurm_conf, poll_interval="1s")
    cfg = d.config.read_text() + '[checkpoints]\ncheck_interval = "1s"\nsignal_grace = "3s"\n'
    d.config.write_text(cfg)
    d.start()
    try:
        run_id = d.submit(_spec(tmp_path, "fingerprint"))
        d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        made = [p for p in (tmp_path / "run" / "ckpt").glob("step_*")
                if (p / ".b300-manifest.json").exists()]
        assert len(made) >= 2
        listing = d.ctl("checkpoints", run_id)
        assert any(c.get("verified") for c in _flatten(listing))

        usr1 = tmp_path / "usr1.txt"
        spec = tmp_path / "quiet.toml"
        body = (f"trap 'echo got USR1 >> {usr1}' USR1\n"
                f"srun {sys.executable} {TRAIN} --steps 80 --ckpt-every 1000 --step-time 0.25 &\n"
                "pid=$!\nwhile kill -0 $pid 2>/dev/null; do wait $pid; done\n")
        (tmp_path / "run2" / "ckpt").mkdir(parents=True)
        spec.write_text("\n".join([
            'name = "quiet"', "[job]", f"command = {json.dumps(body)}", "nodes = 2",
            "ntasks_per_node = 1", "gpus_per_node = 0", "[checkpoint]",
            f'dir = "{tmp_path / "run2" / "ckpt"}"', 'layout = "dcp"', 'interval = "5s"',
            'signal = "USR1"']) + "\n")
        quiet = d.submit(spec)
        wait_for(lambda: any(e["kind"] == "checkpoint.overdue" for e in d.run(quiet)["events"]),
                 120, "the overdue alert")
        wait_for(lambda: usr1.exists() and "got USR1" in usr1.read_text(), 60,
                 "USR1 to reach the job")
        d.ctl("cancel", quiet)
    finally:
        d.cleanup()


def _flatten(listing: Any) -> list[dict[str, Any]]:
    """Checkpoint rows of `b300ctl checkpoints RUN --json`, whatever its nesting."""
    if isinstance(listing, list):
        return [r for item in listing for r in _flatten(item)]
    if isinstance(listing, dict):
        if "path" in listing:
            return [listing]
        return [r for v in listing.values() for r in _flatten(v)]
    return []
