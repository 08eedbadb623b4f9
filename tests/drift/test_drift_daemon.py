"""``b300ctl drift scan`` and ``b300ctl drift`` against a real b300d and real sshd nodes."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from drift_nodes import Sim

from helpers import cancel_test_jobs, make_daemon

pytestmark = pytest.mark.slurm


def test_scan_on_demand_through_the_daemon_and_show_the_matrix(
    sim: Sim, tmp_path: Path, slurm_conf: str
) -> None:
    handle = make_daemon(tmp_path, slurm_conf)
    nodes = "".join(f'gpu0{i} = {{ host = "127.0.0.1", port = {sim.port(f"good{i}")}, partition = "batch" }}\n'
                    for i in range(1, 5))
    with handle.config.open("a") as f:
        f.write(f"[drift]\nknown_hosts = {json.dumps(str(sim.known_hosts))}\n"
                f"key_file = {json.dumps(str(sim.key))}\ncommand_timeout = \"5s\"\n"
                f'probes = ["driver", "nccl", "cuda"]\n[drift.nodes]\n{nodes}')
    handle.start()
    try:
        empty = handle.ctl("drift")
        assert empty["scanned_at"] is None
        result = handle.ctl("drift", "scan", "gpu[01-02]")
        assert sorted(result["nodes"]) == ["gpu01", "gpu02"]
        assert {n["status"] for n in result["nodes"].values()} == {"ok"}
        assert result["findings"] == [] and result["drained"] == []
        shown = handle.ctl("drift")
        assert shown["nodes"]["gpu01"]["values"]["nccl"]["value"] == "2.23.4"
        assert shown["expected"] == {"batch": {"cuda": "12.9.86", "driver": "580.65.06", "nccl": "2.23.4"}}
        table = handle.ctl_raw("drift")
        assert table.returncode == 0 and "NCCL" in table.stdout and "2.23.4" in table.stdout
        bad = handle.ctl_raw("drift", "scan", "gpu99")
        assert bad.returncode == 2 and "not in [drift.nodes]" in bad.stderr
    finally:
        handle.kill(signal.SIGTERM)
        cancel_test_jobs(slurm_conf, handle)
