"""b300d under its systemd unit's view of the filesystem (issue 11): ``ProtectSystem=
strict`` makes everything read-only but the unit's ``ReadWritePaths``, so the
daemon could write no manifest and prune nothing in checkpoint folders.

The view is built for real in a mount namespace (``unshare --mount``): every
folder ``b300d --print-paths`` names (what ``deploy/install.sh`` writes into the
unit's drop-in: state_dir, job_log_dir, ``[checkpoints] roots``) is bind-mounted
onto itself, ``/tmp`` is a private tmpfs (``PrivateTmp``), then ``/`` is
remounted read-only. The daemon inside tracks a real job that writes generic
checkpoints, makes their manifests and prunes the older ones; a spec whose
checkpoint folder is outside the roots is refused at submit with one line.
(``ProtectHome`` is not copied: this interpreter may live under /root.)
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import REPO, DaemonHandle, make_daemon, wait_for

pytestmark = pytest.mark.slurm
WORKLOAD = REPO / "tests" / "workload" / "steps.py"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="b300-ro-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start_in_unit_view(d: DaemonHandle) -> list[str]:
    paths = subprocess.run([sys.executable, "-m", "b300.app.main", "--config", str(d.config),
                            "--print-paths"], capture_output=True, text=True, timeout=60,
                           check=True, env=d.env).stdout.split()
    for p in paths:
        Path(p).mkdir(parents=True, exist_ok=True)
    script = "set -e\n" + "".join(f"mount --bind {shlex.quote(p)} {shlex.quote(p)}\n" for p in paths)
    # PrivateTmp hides a checkout under /tmp (where the editable install points): carry it
    # over the new tmpfs, as the unit would see a package installed outside /tmp.
    under_tmp = REPO.is_relative_to("/tmp")
    held = d.state_dir.parent / "repo-held"
    if under_tmp:
        held.mkdir(exist_ok=True)
        script += f"mount --bind {shlex.quote(str(REPO))} {shlex.quote(str(held))}\n"
    script += "mount -t tmpfs tmpfs /tmp\n"
    if under_tmp:
        script += (f"mkdir -p {shlex.quote(str(REPO))}\n"
                   f"mount --bind {shlex.quote(str(held))} {shlex.quote(str(REPO))}\n")
    script += "mount -o remount,bind,ro /\n"
    script += f"exec {shlex.quote(sys.executable)} -m b300.app.main --config {shlex.quote(str(d.config))}\n"
    with open(d.log, "ab") as out:
        # unshare and sh exec: the pid is the daemon's own.
        d.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                                  env=d.env, stdout=out, stderr=subprocess.STDOUT)
    wait_for(lambda: d.ping() or d.proc.poll() is not None, 60, "b300d to answer")  # type: ignore[union-attr]
    assert d.proc.poll() is None, d.log.read_text()[-3000:]
    return paths


def _spec(path: Path, ckpt: Path) -> Path:
    command = f"srun /usr/bin/python3 {ckpt.parent / 'steps.py'} --steps 20 --ckpt-every 5 --step-time 0.3"
    path.write_text("\n".join([
        f'name = "{path.stem}"', "[job]", f"command = {json.dumps(command)}", "nodes = 1",
        "gpus_per_node = 0", 'time_limit = "00:10:00"',
        "[checkpoint]", f'dir = "{ckpt}"', 'layout = "generic"',
    ]) + "\n")
    return path


def test_checkpoint_pass_and_prune_under_the_units_read_only_view(base: Path, slurm_conf: str) -> None:
    root = base / "ckpt-root"
    d = make_daemon(base, slurm_conf)
    d.config.write_text(d.config.read_text() + "\n".join([
        "[checkpoints]", 'check_interval = "1s"', 'maintain_interval = "1s"', "prune = true",
        "keep_last = 1", 'keep_hourly_for = "0"', 'keep_daily_for = "0"', f'roots = ["{root}"]',
    ]) + "\n")
    (root / "run1").mkdir(parents=True)
    shutil.copy2(WORKLOAD, root / "run1" / "steps.py")
    outside = base / "outside"
    (outside / "run2").mkdir(parents=True)
    try:
        paths = _start_in_unit_view(d)
        assert str(root) in paths and str(d.state_dir) in paths
        assert d.proc is not None
        # The view is real: outside the listed folders the daemon's namespace is read-only.
        probe = subprocess.run(["nsenter", f"--mount=/proc/{d.proc.pid}/ns/mnt", "touch",
                                str(outside / "probe")], capture_output=True, text=True, timeout=30,
                               check=False)
        assert probe.returncode != 0 and "Read-only file system" in probe.stderr, probe.stderr

        refused = d.ctl_raw("submit", str(_spec(base / "elsewhere.toml", outside / "run2" / "ckpt")))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and "outside [checkpoints] roots" in refused.stderr

        run_id = d.submit(_spec(base / "inroot.toml", root / "run1" / "ckpt"))
        d.wait_run(run_id, {"COMPLETED"}, timeout=180)
        ckpt = root / "run1" / "ckpt"
        wait_for(lambda: (ckpt / "step_000020" / ".b300-manifest.json").exists(), 60,
                 "the newest checkpoint's manifest")
        wait_for(lambda: sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step_"))
                 == ["step_000020"], 60, "the older checkpoints pruned")
        log = d.log.read_text()
        assert "Read-only file system" not in log, log[-3000:]
    finally:
        d.cleanup()
