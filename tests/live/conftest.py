"""Fixtures shared by the live tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from helpers import CLUSTER


@pytest.fixture
def fresh_nodes(slurm_conf: str) -> Iterator[list[str]]:
    """Nodes this test killed come back (slurmd restarted, drain lifted) afterwards."""
    killed: list[str] = []
    yield killed
    for node in killed:
        subprocess.run(["bash", str(CLUSTER), "revive", node], capture_output=True,
                       timeout=120, check=False)
