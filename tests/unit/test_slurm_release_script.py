"""deploy/localcluster.sh and deploy/slurm-release.sh refuse releases they cannot run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(DEPLOY / script), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=False)


@pytest.mark.parametrize("rel", ["23.02", "25.11", "24.11; true", ""])
def test_localcluster_refuses_an_unknown_release(rel: str, tmp_path: Path) -> None:
    proc = _run("localcluster.sh", "env", B300_SLURM=rel or " ", B300_CLUSTER_DIR=str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "B300_SLURM must be 22.05, 24.11 or 26.05" in proc.stderr


def test_env_of_a_newer_release_puts_its_wrappers_first(tmp_path: Path) -> None:
    out = _run("localcluster.sh", "env", B300_SLURM="26.05", B300_CLUSTER_DIR=str(tmp_path)).stdout
    assert out.splitlines() == [f"export SLURM_CONF={tmp_path}/etc/slurm.conf",
                                f'export B300_SLURM=26.05 PATH={tmp_path}/bin:"$PATH"']
    host = _run("localcluster.sh", "env", B300_SLURM="22.05", B300_CLUSTER_DIR=str(tmp_path)).stdout
    assert host.splitlines() == [f"export SLURM_CONF={tmp_path}/etc/slurm.conf"]


def test_slurm_release_refuses_an_unknown_release() -> None:
    proc = _run("slurm-release.sh", "build", "21.08")
    assert proc.returncode == 1 and "unknown Slurm release '21.08'" in proc.stderr
    assert _run("slurm-release.sh", "mount", "22.05", "/var/tmp/x").returncode == 1
    assert _run("slurm-release.sh", "umount", "relative/dir").returncode == 1
    assert _run("slurm-release.sh").returncode == 2
