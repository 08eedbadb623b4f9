"""Simulated nodes for the drift tests: real sshd instances on loopback (see drift_nodes.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import drift_nodes as dn
import pytest
from drift_nodes import Sim

# B300_SSHD_PORT_BASE lets two suites run side by side on one machine.
BASE_PORT = int(os.environ.get("B300_SSHD_PORT_BASE", "22201"))


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """Six nodes: good1-4 alike, ``hung`` (nvidia-smi sleeps 8 s), ``garbage`` (prints ERR!)."""
    specs = {f"good{i}": dn.Versions() for i in range(1, 5)}
    specs["hung"] = dn.Versions(hang_s=8)
    specs["garbage"] = dn.Versions(garbage=True)
    with dn.fleet(tmp_path_factory.mktemp("simnodes"), specs, BASE_PORT) as fleet:
        yield fleet
