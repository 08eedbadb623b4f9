"""Drift scans against real sshd nodes on loopback, tied to the real local Slurm cluster.

The Slurm node names gpu01..gpu04 are mapped to simulated nodes (one sshd
each, see conftest.py); drains and resumes go to the real slurmctld.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from drift_nodes import Sim

from b300.config.tables.drift import parse_drift_config
from b300.drift.plugins import load_probes
from b300.drift.scan_records import DriftConfig, FindingKind, NodeStatus, Policy
from b300.drift.scanner import DriftScanner
from b300.drift.ssh import ParamikoRunner
from b300.safety.mode import Withheld
from b300.scheduling import table as timed
from b300.slurm.cli import CliSlurmClient
from b300.store import SqlStore, open_store
from helpers import slurm_cmd

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.slurm


def drift_config(sim: Sim, nodes: dict[str, int], **extra: Any) -> DriftConfig:
    """A scan of the simulated nodes. The timeouts are generous (connect 20 s, all probes
    30 s; the product's defaults are 5 s and 20 s): beside a CPU hog four concurrent SSH
    handshakes took over 2 s and healthy nodes read TIMEOUT. The test of timeouts
    themselves sets its own."""
    probes = ["driver", "cuda_driver", "gpu_count", "vbios", "cuda", "nccl", "kernel", "ofed", "fabricmanager"]
    table: dict[str, Any] = {
        "known_hosts": str(sim.known_hosts), "key_file": str(sim.key), "connect_timeout": "20s",
        "command_timeout": "30s", "probes": probes,
        # Every probe drains here (the product's default is warn: a site opts in per probe).
        "policy": {p: "drain" for p in probes},
        "nodes": {name: {"host": "127.0.0.1", "port": port, "partition": "batch"}
                  for name, port in nodes.items()},
        **extra,
    }
    return parse_drift_config(table, "test")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with open_store(f"sqlite:///{tmp_path / 'state.db'}") as s:
        yield s


def scanner(cfg: DriftConfig, store: SqlStore, slurm_conf: str) -> DriftScanner:
    return DriftScanner(cfg, store.drift, CliSlurmClient(slurm_conf=slurm_conf),
                        probes=load_probes(cfg.probes), runner=ParamikoRunner(cfg.ssh, cfg.endpoints()))


def node_info(conf: str, node: str) -> tuple[str, str]:
    out = slurm_cmd(conf, "sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T|%E")
    state, reason = out.strip().splitlines()[0].split("|", 1)
    return state, reason


def test_a_node_with_another_nccl_is_drained_and_returns_when_fixed(
    sim: Sim, store: SqlStore, slurm_conf: str
) -> None:
    good = {"gpu01": "good1", "gpu02": "good2", "gpu03": "good3", "gpu04": "good4"}
    cfg = drift_config(sim, {n: sim.port(s) for n, s in good.items()})
    sc = scanner(cfg, store, slurm_conf)
    sim.nodes["good3"].set_nccl("2.21.5")
    try:
        result = sc.scan(None, T0)
        assert {r.node: r.status for r in result.reports} == dict.fromkeys(good, NodeStatus.OK)
        assert [(f.node, f.probe, f.kind, f.expected, f.found, f.policy) for f in result.findings] == [
            ("gpu03", "nccl", FindingKind.DRIFT, "2.23.4", "2.21.5", Policy.DRAIN)]
        assert result.drained == ("gpu03",)
        state, reason = node_info(slurm_conf, "gpu03")
        assert "drain" in state and reason == "drift: nccl 2.21.5 != 2.23.4"
        shown = slurm_cmd(slurm_conf, "scontrol", "show", "node", "gpu03")
        assert "Reason=drift: nccl 2.21.5 != 2.23.4" in shown
        assert "gpu03" in slurm_cmd(slurm_conf, "sinfo", "-R", "--noheader", "--format=%E|%N")
        assert store.drift.open_drift_nodes() == {"gpu03"}
        assert result.reports[0].values["driver"].value == "580.65.06"

        # Scanning again changes nothing: the finding stays open, no second drain.
        again = sc.scan(["gpu03"], T0 + timedelta(minutes=5))
        assert again.opened == () and again.drained == () and again.findings == result.findings

        sim.nodes["good3"].set_nccl("2.23.4")
        fixed = sc.scan(None, T0 + timedelta(hours=1))
        assert fixed.findings == () and [f.node for f in fixed.closed] == ["gpu03"]
        assert fixed.resumed == ("gpu03",)
        assert "drain" not in node_info(slurm_conf, "gpu03")[0]
        assert store.drift.open_drift_nodes() == set() and store.drift.drained_nodes() == {}
        kinds = [(e.kind, e.node) for e in store.events()]
        assert kinds == [("drift.finding", "gpu03"), ("drift.drained", "gpu03"), ("drift.cleared", "gpu03"),
                         ("drift.cleared", "gpu03")]
    finally:
        sim.nodes["good3"].set_nccl("2.23.4")
        subprocess.run(["scontrol", "update", "NodeName=gpu03", "State=RESUME"], capture_output=True,
                       env={"SLURM_CONF": slurm_conf, "PATH": os.environ["PATH"]}, timeout=30, check=False)


def test_withheld_drains_leave_the_node_alone_and_are_recorded(
    sim: Sim, store: SqlStore, slurm_conf: str
) -> None:
    """Observe mode (or [recovery] enabled = false): the finding is the same, the drain is
    withheld, recorded, and made only once in the record however often the scan repeats."""
    good = {"gpu01": "good1", "gpu02": "good2", "gpu03": "good3", "gpu04": "good4"}
    cfg = drift_config(sim, {n: sim.port(s) for n, s in good.items()})
    withheld = Withheld(store.append_events, 'mode = "observe"')
    sc = DriftScanner(cfg, store.drift, CliSlurmClient(slurm_conf=slurm_conf),
                      probes=load_probes(cfg.probes), runner=ParamikoRunner(cfg.ssh, cfg.endpoints()),
                      withheld=withheld)
    sim.nodes["good3"].set_nccl("2.21.5")
    try:
        result = sc.scan(None, T0)
        assert [(f.node, f.probe, f.policy) for f in result.findings] == [("gpu03", "nccl", Policy.DRAIN)]
        assert result.drained == ()
        assert "drain" not in node_info(slurm_conf, "gpu03")[0]
        sc.scan(None, T0 + timedelta(minutes=5))
        held = [e for e in store.events() if e.kind == "action.withheld"]
        assert [(e.node, e.data["action"], e.data["detail"]) for e in held] == [
            ("gpu03", "drain", "drift: nccl 2.21.5 != 2.23.4")]
    finally:
        sim.nodes["good3"].set_nccl("2.23.4")


def test_unreachable_hung_and_rekeyed_nodes_are_reported_not_drained(
    sim: Sim, store: SqlStore, slurm_conf: str, tmp_path: Path
) -> None:
    from drift_nodes import free_port

    # gpu03's sshd now shows a key that is not the one on file: a changed host key.
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    known = tmp_path / "known_hosts"
    known.write_text(sim.known_hosts.read_text().replace(
        sim.nodes["good2"].host_pub, Path(f"{other}.pub").read_text().split()[1]))
    nodes = {"gpu01": sim.port("garbage"), "gpu02": sim.port("hung"), "gpu03": sim.port("good2"),
             "gpu04": free_port()}
    cfg = drift_config(sim, nodes, known_hosts=str(known), pinned={"nccl": "2.23.4", "driver": "580.65.06"},
                       connect_timeout="2s", command_timeout="2s")
    t0 = time.monotonic()
    result = scanner(cfg, store, slurm_conf).scan(None, T0)
    wall = time.monotonic() - t0
    assert wall < 2 + 2 + 3, wall  # connect + command timeouts, with room for a slow machine
    status = {r.node: r.status for r in result.reports}
    assert status == {"gpu01": NodeStatus.OK, "gpu02": NodeStatus.TIMEOUT, "gpu03": NodeStatus.HOSTKEY,
                      "gpu04": NodeStatus.UNREACHABLE}
    assert "CHANGED" in next(r.error for r in result.reports if r.node == "gpu03")
    assert [(f.node, f.probe, f.kind, f.policy) for f in result.findings] == [
        ("gpu01", "driver", FindingKind.UNPARSEABLE, Policy.WARN)]
    assert result.drained == ()
    for node in nodes:
        assert not node_info(slurm_conf, node)[1].startswith("drift:")


def test_unknown_host_keys_are_refused_and_a_jump_host_works(sim: Sim, store: SqlStore, tmp_path: Path) -> None:
    nodes = {"gpu01": sim.port("good1"), "gpu02": sim.port("good2")}
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    cfg = drift_config(sim, nodes, known_hosts=str(empty))
    runs = ParamikoRunner(cfg.ssh, cfg.endpoints()).run(list(nodes), {"k": "uname -r"})
    assert {r.status for r in runs.values()} == {NodeStatus.HOSTKEY}

    # Through good4's sshd as the jump host (ssh -J): the nodes see connections from it.
    cfg = drift_config(sim, nodes, jump_host=f"127.0.0.1:{sim.port('good4')}")
    runs = ParamikoRunner(cfg.ssh, cfg.endpoints()).run(list(nodes), {"ip": "echo $SSH_CLIENT"})
    assert {r.status for r in runs.values()} == {NodeStatus.OK}
    assert all(r.results["ip"].stdout.startswith("127.0.0.1 ") for r in runs.values())

    cfg = drift_config(sim, nodes, jump_host=f"127.0.0.1:{sim.port('good4')}", known_hosts=str(empty))
    runs = ParamikoRunner(cfg.ssh, cfg.endpoints()).run(list(nodes), {"k": "true"})
    assert {r.status for r in runs.values()} == {NodeStatus.HOSTKEY}
    assert all("jump host" in r.error for r in runs.values())


def test_watch_rescans_only_when_the_last_scan_is_too_old(sim: Sim, store: SqlStore, slurm_conf: str) -> None:
    import threading

    from apscheduler.schedulers.background import BackgroundScheduler

    from b300.drift.scheduled import DriftWatch

    now = [T0]
    cfg = drift_config(sim, {"gpu01": sim.port("good1"), "gpu02": sim.port("good2")},
                       max_age="1h", interval="10m", probes=["nccl"])
    service = DriftWatch(scanner(cfg, store, slurm_conf), threading.Lock(), lambda: now[0])
    first = service.scan_if_stale(now[0])
    assert first is not None and {r.status for r in first.reports} == {NodeStatus.OK}
    now[0] = T0 + timedelta(minutes=59)
    assert service.scan_if_stale(now[0]) is None
    now[0] = T0 + timedelta(minutes=61)
    assert service.scan_if_stale(now[0]) is not None
    scheduler = BackgroundScheduler(timezone=UTC)
    timed.place(scheduler, {"drift": service.timed_job()})
    job = scheduler.get_job("drift")
    assert job is not None and job.trigger.interval == timedelta(minutes=10)


def test_a_drifted_host_that_is_not_a_slurm_node_is_reported_not_drained(
    sim: Sim, store: SqlStore, slurm_conf: str
) -> None:
    """A finding for a host Slurm does not know (a typo in [drift.nodes], a retired
    node): reported as a finding and as a failed action (warning + event), never a
    drain, and ``b300ctl drift`` shows it."""
    names = {"gpu01": "good1", "gpu02": "good2", "notslurm9": "good3"}
    cfg = drift_config(sim, {n: sim.port(s) for n, s in names.items()})
    sim.nodes["good3"].set_nccl("2.21.5")
    try:
        result = scanner(cfg, store, slurm_conf).scan(None, T0)
    finally:
        sim.nodes["good3"].set_nccl("2.23.4")
    assert [(f.node, f.probe) for f in result.findings] == [("notslurm9", "nccl")]
    assert result.drained == ()
    assert any("notslurm9" in e and "not a Slurm node" in e for e in result.errors), result.errors
    failed = store.events(kinds=["drift.action_failed"])
    assert [(e.node, "not a Slurm node" in e.data["error"]) for e in failed] == [("notslurm9", True)]
