"""``b300ctl resubmit`` as an operator uses it, on the real cluster with the real
CPU training workload (tests/workload/train.py) and a real b300d.

- Without ``--from-checkpoint`` a resubmission resumes from the run's newest
  verified checkpoint, and keeps the previous attempt's exclusions that hold.
- ``--from-checkpoint PATH`` is refused in one line (exit 2) unless PATH is a
  complete checkpoint of the run's layout whose manifest verifies; ``--force``
  skips the verification, never the check that PATH exists.
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from helpers import DaemonHandle, make_daemon, wait_for

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parent.parent / "workload" / "train.py"
ENDED = {"COMPLETED", "FAILED", "CANCELLED"}


def train_spec(tmp_path: Path, name: str, *train_args: str, steps: int = 30,
               nodes: int = 2, infra: int = 3) -> Path:
    """A spec running the CPU workload on ``nodes`` nodes, checkpointing every 5 steps."""
    run_dir = tmp_path / "run"
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    command = (f"srun {sys.executable} {TRAIN} --steps {steps} --ckpt-every 5 "
               f"--step-time 0.3 {' '.join(train_args)}")
    spec = tmp_path / f"{name}.toml"
    spec.write_text("\n".join([
        f'name = "{name}"', "[job]", f"command = {json.dumps(command)}", f"nodes = {nodes}",
        "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
        "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[health]", f'progress_file = "{run_dir / "progress.json"}"',
        "[retries]", f"infra = {infra}",
    ]) + "\n")
    return spec


def history(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def progress(tmp_path: Path) -> int:
    try:
        return int(json.loads((tmp_path / "run" / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def start_daemon(tmp_path: Path, conf: str, extra: str = "") -> DaemonHandle:
    d = make_daemon(tmp_path, conf, poll_interval="1s")
    if extra:
        d.config.write_text(d.config.read_text() + extra)
    d.start()
    return d


def _refused(d: DaemonHandle, *args: str) -> str:
    proc = d.ctl_raw(*args)
    assert proc.returncode == 2, (args, proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def test_resubmit_resumes_from_newest_verified_checkpoint_and_keeps_exclusions(
    tmp_path: Path, slurm_conf: str
) -> None:
    d = start_daemon(tmp_path, slurm_conf)
    try:
        # Attempt 1 dies of its own error at step 12 (checkpoints at 5 and 10): not resubmitted.
        run_id = d.submit(train_spec(tmp_path, "resub", "--fail-at", "12", steps=80))
        status = d.wait_run(run_id, ENDED, timeout=180)
        assert status["run"]["state"] == "FAILED", status["events"][-5:]
        # The operator resubmits, keeping the run off gpu04: it resumes from step 10.
        d.ctl("resubmit", run_id, "--exclude", "gpu04")
        wait_for(lambda: progress(tmp_path) >= 17 and len(history(tmp_path)) >= 2, 180,
                 "attempt 2 to pass step 17")
        a2 = d.run(run_id)["attempts"][1]
        assert a2["resume_from"] == str(tmp_path / "run" / "ckpt" / "step_000010")
        assert history(tmp_path)[1]["start_step"] == 10
        assert a2["excluded_nodes"] == ["gpu04"] and "gpu04" not in a2["nodes"]
        d.ctl("cancel", run_id)
        d.wait_run(run_id, ENDED, timeout=120)
        newest = max(p for p in (tmp_path / "run" / "ckpt").glob("step_*")
                     if (p / ".metadata").exists())
        # A plain resubmit: the newest complete checkpoint, the operator's exclusion kept.
        d.ctl("resubmit", run_id)
        status = d.wait_run(run_id, ENDED, timeout=240)
        assert status["run"]["state"] == "COMPLETED", status["events"][-5:]
        a3 = status["attempts"][2]
        assert a3["resume_from"] == str(newest) and int(newest.name[5:]) >= 15
        assert history(tmp_path)[2]["start_step"] == int(newest.name[5:])
        assert a3["excluded_nodes"] == ["gpu04"] and "gpu04" not in a3["nodes"]
        done = json.loads((tmp_path / "run" / "done.json").read_text())
        assert done["attempt"] == 3 and done["step"] == 80
        [intent] = [e for e in status["events"]
                    if e["kind"] == "attempt.intent" and e["attempt_id"] == _aid(status, 3)]
        assert intent["data"]["resume"] == "newest verified"
        assert intent["data"]["exclusions"][0]["cause"] == "operator"
    finally:
        d.cleanup()


def test_from_checkpoint_must_be_a_complete_verified_checkpoint_of_the_run(
    tmp_path: Path, slurm_conf: str
) -> None:
    d = start_daemon(tmp_path, slurm_conf)
    try:
        run_id = d.submit(train_spec(tmp_path, "pick", "--fail-at", "7"))
        status = d.wait_run(run_id, ENDED, timeout=180)
        assert status["run"]["state"] == "FAILED"
        ckpt = tmp_path / "run" / "ckpt"
        good = ckpt / "step_000005"
        assert (good / ".metadata").exists()

        err = _refused(d, "resubmit", run_id, "--from-checkpoint", str(ckpt / "step_000099"))
        assert "no such file or directory" in err
        err = _refused(d, "resubmit", run_id, "--from-checkpoint", str(ckpt / "nope"), "--force")
        assert "no such file or directory" in err
        # Exists, but is not a checkpoint of the run's layout under its folder.
        err = _refused(d, "resubmit", run_id, "--from-checkpoint", str(tmp_path / "run"))
        assert "not a checkpoint of run" in err
        # A torn copy: a shard but no .metadata.
        torn = ckpt / "step_000006"
        torn.mkdir()
        shutil.copy(good / "__0_0.distcp", torn / "__0_0.distcp")
        err = _refused(d, "resubmit", run_id, "--from-checkpoint", str(torn))
        assert "incomplete" in err
        # A manifest the files no longer match (one recorded sha256 spoilt; the data is
        # left intact so that --force below can still load it).
        from b300.checkpoints.manifest import MANIFEST_NAME, ensure_manifest

        ensure_manifest(str(good), datetime.now(UTC), root=str(ckpt))
        doc = json.loads((good / MANIFEST_NAME).read_text())
        doc["files"][0]["sha256"] = "0" * 64
        (good / MANIFEST_NAME).write_text(json.dumps(doc))
        err = _refused(d, "resubmit", run_id, "--from-checkpoint", str(good))
        assert "fails verification" in err
        assert len(d.run(run_id)["attempts"]) == 1, "a refused resubmit must submit nothing"
        # --force takes the operator's word for it.
        d.ctl("resubmit", run_id, "--from-checkpoint", str(good), "--force")
        status = d.wait_run(run_id, ENDED, timeout=240)
        assert status["run"]["state"] == "COMPLETED", status["events"][-5:]
        assert status["attempts"][1]["resume_from"] == str(good)
        assert history(tmp_path)[1]["start_step"] == 5
    finally:
        d.cleanup()


def _aid(status: dict[str, Any], number: int) -> int:
    """The store id of attempt ``number``: the id its events carry."""
    ids = sorted({e["attempt_id"] for e in status["events"]
                  if e["kind"] == "attempt.intent" and e["attempt_id"] is not None})
    return ids[number - 1]
