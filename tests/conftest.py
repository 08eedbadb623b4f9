"""Shared fixtures: the real local Slurm cluster, a real b300d process on it, PostgreSQL.

Nothing of the project's own code is faked here: the daemon runs as its own
process (``python -m b300.app.main``), b300ctl as another, and both talk
to the Slurm cluster that ``deploy/localcluster.sh`` brings up on this machine.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CLUSTER, DaemonHandle, make_daemon


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """Bring the local cluster up (idempotent) and return its SLURM_CONF."""
    proc = subprocess.run(
        ["bash", str(CLUSTER), "up"], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"local Slurm cluster did not come up:\n{proc.stdout}\n{proc.stderr}")
    env = subprocess.run(
        ["bash", str(CLUSTER), "env"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    conf = ""
    for line in env.splitlines():  # export SLURM_CONF=...; newer releases also PATH
        name, _, value = line.removeprefix("export ").partition("=")
        if name == "SLURM_CONF":
            conf = value.strip("'\"")
    os.environ["SLURM_CONF"] = conf
    return conf


@pytest.fixture
def daemon(tmp_path: Path, slurm_conf: str) -> Iterator[DaemonHandle]:
    """A started b300d on SQLite, stopped (and its jobs cancelled) after the test."""
    handle = make_daemon(tmp_path, slurm_conf)
    handle.start()
    yield handle
    handle.cleanup()


from store_fixtures import pg_database_fixture  # noqa: E402,F401 - a fixture, used by name


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The URL of a fresh PostgreSQL database (the module's own)."""
    return pg_database
