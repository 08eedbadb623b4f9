"""Real sshd nodes on loopback for the confirmation check (the drift tests' simulated nodes)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drift"))

import drift_nodes as dn
from drift_nodes import Sim

# Beside the drift suite's ports (B300_SSHD_PORT_BASE + 0..5): + 40 onwards.
BASE_PORT = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 40


@pytest.fixture(scope="module")
def ssh_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """Two nodes, ``n1`` and ``n2``, each a real sshd; ``known_hosts`` holds both keys."""
    base = tmp_path_factory.mktemp("liveness-ssh")
    key = dn.client_key(base)
    auth = base / "authorized_keys"
    auth.write_text(Path(f"{key}.pub").read_text())
    nodes = {name: dn.make_node(base, name, BASE_PORT + i, dn.Versions(), auth)
             for i, name in enumerate(["n1", "n2"])}
    known = base / "known_hosts"
    known.write_text("".join(n.known_hosts_line() for n in nodes.values()))
    dn.start(nodes.values())
    try:
        yield Sim(nodes, key, known, base)
    finally:
        dn.stop(nodes.values())
