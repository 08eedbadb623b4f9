"""The daemon's liveness checks at the defaults: no [drift], no credentials.

A real b300d on the test cluster with no ``[liveness]`` table at all starts the ICMP
echo check and the SYN confirmation (it runs as root here, so both sockets open); in
observe mode the same watch runs and says that it will not act. Every node here is
127.0.0.1 and always answers, so what is checked is that the watch is built and runs
with nothing configured, not a dead node (the namespace tests in tests/liveness do that).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import make_daemon, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the SYN check's raw socket needs CAP_NET_RAW (root)")


def _liveness_on(log: Path) -> dict | None:  # type: ignore[type-arg]
    for line in log.read_text(errors="replace").splitlines():
        if '"liveness.on"' in line:
            return json.loads(line)  # type: ignore[no-any-return]
    return None


@pytest.mark.parametrize("mode", ["act", "observe"])
def test_liveness_runs_at_the_defaults_without_drift(tmp_path: Path, slurm_conf: str, mode: str) -> None:
    d = make_daemon(tmp_path, slurm_conf, mode=mode)
    try:
        d.start()
        on = wait_for(lambda: _liveness_on(d.log), 30, "the liveness.on line")
        assert (on["primary"], on["confirm"], on["acting"]) == ("icmp", "syn", mode == "act"), on
        assert '"liveness.probe_unavailable"' not in d.log.read_text()
    finally:
        d.cleanup()
