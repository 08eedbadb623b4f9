"""Node triage (issue 32) end to end on the local cluster, with stand-in GPU tools.

Four nodes drained with the daemon's own reasons: a healthy one returns; one whose
(stand-in) nvidia-smi reports uncorrectable ECC errors and one with an Xid line in its
kernel log stay drained with a reason naming the failed check; a lemon (drained three
times this week) is never run nor returned. Then a daemon killed with SIGKILL while a
triage job runs finishes that triage after its restart.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_resubmit_live import progress, train_spec

from b300.events import Kind
from b300.interfaces import NewEvent
from helpers import DaemonHandle, cancel_test_jobs, make_daemon, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
NODES = ("gpu01", "gpu02", "gpu03", "gpu04")
DEAD = "b300: node dead (b300d checks): sshd refused (test)"

SMI = """#!/bin/sh
# stand-in nvidia-smi: DRAM uncorrectable count from $B300_TEST_GPU/ecc-<node> (default 0)
n=$(cat "$B300_TEST_GPU/ecc-$SLURMD_NODENAME" 2>/dev/null || echo 0)
if [ "$1" = nvlink ]; then echo "GPU 0: Link 0: 26.562 GB/s"; exit 0; fi
printf 'GPU 00000000:17:00.0\\n    ECC Errors\\n        Volatile\\n'
printf '            DRAM Uncorrectable                : %s\\n' "$n"
"""


def node(conf: str, name: str) -> dict[str, str]:
    out = slurm_cmd(conf, "scontrol", "show", "node", name, "-o")
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def verdicts(d: DaemonHandle) -> dict[str, dict[str, Any]]:
    from b300.store import open_store

    store = open_store(d.database_url)
    try:
        return {e.node or "": e.data for e in store.events(kinds=[Kind.TRIAGE_VERDICT])}
    finally:
        store.close()


def add_events(d: DaemonHandle, *events: NewEvent) -> None:
    from datetime import UTC, datetime

    from b300.store import open_store

    store = open_store(d.database_url)
    try:
        store.append_events(list(events), datetime.now(UTC))
    finally:
        store.close()


@pytest.fixture
def gpu(tmp_path: Path) -> Path:
    """A bin folder with the stand-in nvidia-smi, put first on the daemon's (and so its jobs') PATH."""
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    return bin_dir


@pytest.fixture
def daemon(tmp_path: Path, slurm_conf: str, gpu: Path) -> Iterator[DaemonHandle]:
    d = make_daemon(tmp_path, slurm_conf)
    d.env["PATH"] = f"{gpu}:{d.env['PATH']}"
    d.env["B300_TEST_GPU"] = str(tmp_path)
    (tmp_path / "logs").mkdir()
    gate = tmp_path / "gate"
    with d.config.open("a") as f:
        f.write("[triage]\nenabled = true\ninterval_s = 1.0\nlemon_drains = 3\n"
                '[[triage.check]]\nname = "node-check"\ntimeout_s = 60\n'
                f'args = ["--kernel-log", "{tmp_path}/logs/kern-{{node}}.log", "--disk", "{tmp_path}"]\n'
                '[[triage.check]]\nname = "gate"\ntimeout_s = 120\n'
                f'argv = ["/bin/sh", "-c", "while [ ! -e {gate} ]; do sleep 0.2; done"]\n')
    try:
        yield d
    finally:
        d.kill()
        for n in NODES:
            slurm_cmd(slurm_conf, "scancel", f"--name=b300-triage-{n}")
            if f"b300-triage-{n}" in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o"):
                slurm_cmd(slurm_conf, "scontrol", "delete", f"ReservationName=b300-triage-{n}")
            if "DRAIN" in node(slurm_conf, n).get("State", ""):
                slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={n}", "State=RESUME")


def test_healthy_returns_faulty_stay_out_a_lemon_never_runs(daemon: DaemonHandle, slurm_conf: str,
                                                            tmp_path: Path) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    (tmp_path / "gate").touch()
    (tmp_path / "ecc-gpu02").write_text("2\n")
    (tmp_path / "logs" / "kern-gpu03.log").write_text(
        "[812.1] NVRM: Xid (PCI:0000:17:00): 79, pid=0, GPU has fallen off the bus.\n")
    daemon.start()
    add_events(daemon, *[NewEvent(Kind.NODE_DRAINED, node="gpu04", data={"reason": DEAD}) for _ in range(3)])
    t0 = time.monotonic()
    for n in NODES:
        slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={n}", "State=DRAIN", f"Reason={DEAD}")
    v = wait_for(lambda: (got := verdicts(daemon)).keys() >= set(NODES) and got, 150, "four verdicts")
    assert v["gpu01"]["verdict"] == "pass" and v["gpu01"]["resumed"] is True
    assert (v["gpu02"]["verdict"], v["gpu02"]["failed_check"]) == ("fail", "gpu-ecc")
    assert (v["gpu03"]["verdict"], v["gpu03"]["failed_check"]) == ("fail", "xid")
    assert (v["gpu04"]["verdict"], v["gpu04"]["drains"]) == ("lemon", 3)
    print(f"triage: drained -> verdicts for 4 nodes in {time.monotonic() - t0:.1f} s")
    assert "DRAIN" not in node(slurm_conf, "gpu01")["State"]
    assert "triage failed gpu-ecc" in slurm_cmd(slurm_conf, "sinfo", "-R", "-h", "-n", "gpu02", "-o", "%E")
    assert "triage failed xid" in slurm_cmd(slurm_conf, "sinfo", "-R", "-h", "-n", "gpu03", "-o", "%E")
    assert "triage lemon" in slurm_cmd(slurm_conf, "sinfo", "-R", "-h", "-n", "gpu04", "-o", "%E")
    assert "b300-triage" not in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o")
    # the lemon never ran a job; the kept-out nodes are not triaged again
    assert slurm_cmd(slurm_conf, "sacct", "-X", "-n", "--name=b300-triage-gpu04", "-S", since,
                     "-o", "JobID").strip() == ""
    time.sleep(3)
    assert len(verdicts(daemon)) == 4
    for n in ("gpu02", "gpu03", "gpu04"):
        assert "DRAIN" in node(slurm_conf, n)["State"]


def test_kill_9_mid_triage_finishes_after_restart(daemon: DaemonHandle, slurm_conf: str,
                                                  tmp_path: Path) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    daemon.start()
    t0 = time.monotonic()
    slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu01", "State=DRAIN", f"Reason={DEAD}")
    first = wait_for(lambda: [ln.split()[0] for ln in slurm_cmd(
        slurm_conf, "squeue", "-h", "--name=b300-triage-gpu01", "-o", "%i %T").splitlines()
        if ln.endswith(" RUNNING")], 60, "the triage job to run")
    daemon.kill(signal.SIGKILL)
    (tmp_path / "gate").touch()
    daemon.start()
    v = wait_for(lambda: verdicts(daemon).get("gpu01"), 90, "the verdict after the restart")
    assert (v["verdict"], v["resumed"]) == ("pass", True), json.dumps(v)
    assert "DRAIN" not in node(slurm_conf, "gpu01")["State"]
    assert "b300-triage-gpu01" not in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o")
    # The restarted daemon adopted the job and did not start another. Accounting records
    # a job a moment after the controller ends it: wait for sacct to know the first one.
    jobs = wait_for(lambda: (lambda ids: ids if first[0] in ids else None)(slurm_cmd(
        slurm_conf, "sacct", "-X", "-n", "--name=b300-triage-gpu01", "-S", since, "-o", "JobID").split()),
        60, f"sacct to know triage job {first[0]}")
    assert jobs == first, jobs
    assert slurm_cmd(slurm_conf, "squeue", "-h", "--name=b300-triage-gpu01", "-o", "%i").strip() == ""
    print(f"triage: drain -> returned across a kill -9 in {time.monotonic() - t0:.1f} s")


def test_an_operator_triages_a_lemon_and_makes_it_returnable(daemon: DaemonHandle, slurm_conf: str,
                                                             tmp_path: Path) -> None:
    (tmp_path / "gate").touch()
    daemon.start()
    add_events(daemon, *[NewEvent(Kind.NODE_DRAINED, node="gpu02", data={"reason": DEAD}) for _ in range(3)])
    slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=DRAIN", f"Reason={DEAD}")
    wait_for(lambda: verdicts(daemon).get("gpu02"), 60, "the lemon verdict")
    shown = daemon.ctl("nodes", "show", "gpu02")
    assert shown["lemon"] is True and shown["drains"] == 3
    text = daemon.ctl_raw("nodes", "show", "gpu02").stdout
    assert "LEMON" in text and "cause liveness" in text and "triage.verdict" in text, text
    proc = daemon.ctl_raw("nodes", "triage", "gpu02", "--returnable")
    assert proc.returncode == 0, proc.stderr
    v = wait_for(lambda: (got := verdicts(daemon).get("gpu02")) and got["verdict"] == "pass" and got,
                 90, "a pass after the override")
    assert v["resumed"] is True and "DRAIN" not in node(slurm_conf, "gpu02")["State"]
    shown = daemon.ctl("nodes", "show", "gpu02")
    kinds = [h["kind"] for h in shown["history"]]
    assert kinds.count("triage.override") == 1 and kinds[-1] == "node.resumed" and shown["lemon"] is False
    assert daemon.ctl_raw("nodes", "triage", "bad name!").returncode == 2


def test_observe_mode_withholds_every_triage(tmp_path: Path, slurm_conf: str, gpu: Path) -> None:
    d = make_daemon(tmp_path, slurm_conf, mode="observe")
    with d.config.open("a") as f:
        f.write("[triage]\nenabled = true\ninterval_s = 1.0\n")
    d.start()
    try:
        slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu03", "State=DRAIN", f"Reason={DEAD}")
        from b300.store import open_store

        def withheld() -> list[dict[str, Any]]:
            store = open_store(d.database_url)
            try:
                return [e.data for e in store.events(kinds=[Kind.ACTION_WITHHELD]) if e.node == "gpu03"]
            finally:
                store.close()

        got = wait_for(withheld, 30, "the withheld triage")
        assert got[0]["action"] == "triage" and got[0]["detail"] == DEAD
        time.sleep(2)
        assert "DRAIN" in node(slurm_conf, "gpu03")["State"] and verdicts(d) == {}
        assert "b300-triage" not in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o")
    finally:
        d.kill()
        slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu03", "State=RESUME")


FAULT_TILL_REBOOT = """#!/bin/sh
# stand-in nvidia-smi: an uncorrectable ECC count until the node reboots (the uptime its
# jobs see drops below the node's uptime when the test began: the local cluster's
# RebootProgram restarts slurmd with a boot clock at 0)
up=$(cut -d. -f1 /proc/uptime)
n=0; [ "$up" -ge "$(cat "$B300_TEST_GPU/fault-uptime")" ] && n=2
if [ "$1" = nvlink ]; then echo "GPU 0: Link 0: 26.562 GB/s"; exit 0; fi
printf 'GPU 00000000:17:00.0\\n    ECC Errors\\n        Volatile\\n'
printf '            DRAM Uncorrectable                : %s\\n' "$n"
"""


def test_a_fault_a_reboot_clears_returns_the_node(tmp_path: Path, slurm_conf: str) -> None:
    """[triage] reboot: the checks fail (ECC), the node is rebooted once through Slurm
    (scontrol reboot ASAP nextstate=DOWN: the local RebootProgram), checked again, passes."""
    if "RebootProgram" not in slurm_cmd(slurm_conf, "scontrol", "show", "config").replace(" ", ""):
        pytest.skip("the local cluster has no RebootProgram (deploy/localcluster.sh up sets one)")
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAULT_TILL_REBOOT)
    (bin_dir / "nvidia-smi").chmod(0o755)
    boot_before = node(slurm_conf, "gpu02")["BootTime"]
    up = time.time() - datetime.strptime(boot_before, "%Y-%m-%dT%H:%M:%S").timestamp()
    assert up > 60, f"gpu02 booted {up:.0f} s ago: too recent to tell a reboot by its uptime"
    (tmp_path / "fault-uptime").write_text(f"{int(up) - 5}\n")
    d = make_daemon(tmp_path, slurm_conf)
    d.env["PATH"] = f"{bin_dir}:{d.env['PATH']}"
    d.env["B300_TEST_GPU"] = str(tmp_path)
    with d.config.open("a") as f:
        f.write("[triage]\nenabled = true\ninterval_s = 1.0\nreboot = true\n"
                '[[triage.check]]\nname = "node-check"\ntimeout_s = 60\n'
                f'args = ["--kernel-log", "/dev/null", "--disk", "{tmp_path}"]\n')
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    d.start()
    try:
        t0 = time.monotonic()
        slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=DRAIN", f"Reason={DEAD}")
        v = wait_for(lambda: verdicts(d).get("gpu02"), 50, "the verdict after the reboot")
        took = time.monotonic() - t0
        assert (v["verdict"], v["rebooted"], v["resumed"]) == ("pass", True, True), json.dumps(v)
        assert "after a reboot" in v["evidence"] and "gpu-ecc" in v["evidence"], v["evidence"]
        state = node(slurm_conf, "gpu02")
        assert state["BootTime"] != boot_before, state
        assert "DRAIN" not in state["State"] and "DOWN" not in state["State"], state
        jobs = wait_for(lambda: (lambda ids: ids if len(ids) >= 2 else None)(slurm_cmd(
            slurm_conf, "sacct", "-X", "-n", "--name=b300-triage-gpu02", "-S", since, "-o", "JobID").split()),
            30, "sacct to know both triage jobs")
        assert len(jobs) == 2, jobs      # the checks, then the checks again: one reboot
        assert "b300-triage-gpu02" not in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o")
        print(f"triage with a reboot: drained -> returned in {took:.1f} s")
    finally:
        d.kill()
        slurm_cmd(slurm_conf, "scancel", "--name=b300-triage-gpu02")
        if "b300-triage-gpu02" in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o"):
            slurm_cmd(slurm_conf, "scontrol", "delete", "ReservationName=b300-triage-gpu02")
        if any(s in node(slurm_conf, "gpu02")["State"] for s in ("DRAIN", "DOWN", "REBOOT")):
            with contextlib.suppress(subprocess.CalledProcessError):   # a reboot still pending
                slurm_cmd(slurm_conf, "scontrol", "cancel_reboot", "gpu02")
            slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=RESUME")


def test_a_triage_never_delays_a_runs_recovery_on_a_busy_cluster(tmp_path: Path, slurm_conf: str) -> None:
    """A 2-node run, a job of someone else on a third node, the fourth idle: a node of the
    run fails. The recovery needs the run's other node and the idle one (every node left);
    the triage of the failed node runs in a reservation of that node alone (held open by a
    gated check), so the resubmitted run starts at once while the triage job still runs."""
    gate = tmp_path / "gate"
    d = make_daemon(tmp_path, slurm_conf, poll_interval="1s")
    with d.config.open("a") as f:
        f.write("[triage]\nenabled = true\ninterval_s = 1.0\n"
                '[[triage.check]]\nname = "gate"\ntimeout_s = 90\n'
                f'argv = ["/bin/sh", "-c", "while [ ! -e {gate} ]; do sleep 0.2; done"]\n')
    d.start()
    other, victim = "", ""
    try:
        run_id = d.submit(train_spec(tmp_path, "busy", "--steps", "2000"))
        survivor, victim = d.wait_run(run_id, {"RUNNING"}, timeout=60)["attempts"][0]["nodes"]
        wait_for(lambda: progress(tmp_path) >= 2, 60, "the run to train")
        busy, idle = sorted(set(NODES) - {survivor, victim})
        other = slurm_cmd(slurm_conf, "sbatch", "--parsable", "-N1", "--exclusive", "-w", busy, "-J",
                          "someone-else", "-o", "/dev/null", "--wrap", "sleep 300").strip().split(";")[0]
        wait_for(lambda: "RUNNING" in slurm_cmd(slurm_conf, "squeue", "-h", "-j", other, "-o", "%T"), 30,
                 "the other job to run")
        t0 = time.monotonic()
        slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=test: failed")
        a2 = wait_for(lambda: (a := d.run(run_id)["attempts"])[1:] and a[1]["state"] == "RUNNING" and a[1],
                      60, "the resubmitted run to start")
        started = time.monotonic() - t0
        name = f"b300-triage-{victim}"
        assert sorted(a2["nodes"]) == sorted([survivor, idle]), a2
        # The triage job may wait for Slurm's next scheduling pass (backfill every 30 s, the
        # main one every 60 s) after its node is resumed into the reservation: read until it runs.
        seen: list[list[str]] = []

        def triage_job() -> list[str]:
            seen.append([ln for ln in slurm_cmd(slurm_conf, "squeue", "-h", f"--name={name}", "-o",
                                                "%T|%N|%r").splitlines() if ln])
            return seen[-1] if seen[-1] and seen[-1][0].startswith("RUNNING|") else []

        triage = wait_for(triage_job, 90, "the triage job to run")
        assert triage == [f"RUNNING|{victim}|None"], (triage, seen[:3])
        # both at once: the triage took no node of the run
        assert d.run(run_id)["attempts"][1]["state"] == "RUNNING"
        resv = slurm_cmd(slurm_conf, "scontrol", "show", "reservation", name, "-o")
        assert f" Nodes={victim} " in resv, resv
        print(f"busy cluster: node failed -> resubmitted run running in {started:.1f} s, beside its triage")
        gate.touch()
        v = wait_for(lambda: verdicts(d).get(victim), 60, "the verdict")
        assert (v["verdict"], v["resumed"]) == ("pass", True), v
        assert d.run(run_id)["attempts"][1]["state"] == "RUNNING"
    finally:
        d.kill()
        if other:
            slurm_cmd(slurm_conf, "scancel", other)
        cancel_test_jobs(slurm_conf, d)
        if victim:
            slurm_cmd(slurm_conf, "scancel", f"--name=b300-triage-{victim}")
            if f"b300-triage-{victim}" in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o"):
                slurm_cmd(slurm_conf, "scontrol", "delete", f"ReservationName=b300-triage-{victim}")
            if any(s in node(slurm_conf, victim)["State"] for s in ("DRAIN", "DOWN")):
                slurm_cmd(slurm_conf, "scontrol", "update", f"NodeName={victim}", "State=RESUME")


def test_a_passed_node_refills_a_short_pool_on_real_slurm(tmp_path: Path, slurm_conf: str) -> None:
    """The spare pools' side of a pass (b300.spares.pools.SparePools.short_pool_for/take), on
    the real controller: a node that passed goes into the short pool's reservation (made if
    missing), a full pool takes nothing more, taking it twice changes nothing."""
    from datetime import UTC

    from b300.plugin_registry import PluginRegistry
    from b300.slurm import make_slurm_client
    from b300.spares.pool_config import load_spares_config
    from b300.spares.pools import SparePools
    from b300.store import open_store

    pool = "b300-spares-batch"
    slurm = make_slurm_client("cli", slurm_conf=slurm_conf, bin_dir=None, timeout=30.0,
                              plugins=PluginRegistry())
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    cfg = load_spares_config({"enabled": True, "pool": [{"partition": "batch", "nodes": 1}]})
    pools = SparePools(store, slurm, lambda: datetime.now(UTC), lambda: cfg)
    try:
        assert pool not in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o")
        assert pools.short_pool_for("gpu02") == pool
        slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=DRAIN",
                  "Reason=b300: triage passed")
        pools.take(pool, "gpu02")
        pools.take(pool, "gpu02")
        slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=RESUME")
        resv = slurm_cmd(slurm_conf, "scontrol", "show", "reservation", pool, "-o")
        assert " Nodes=gpu02 " in resv, resv
        # full (once gpu02 answers: 22.05 shows a node "idle*" for a moment after a resume):
        # gpu03 goes back to general use
        wait_for(lambda: pools.short_pool_for("gpu03") is None, 10, "the pool to count gpu02 idle")
        assert pools.short_pool_for("gpu02") == pool          # already in it (a restart between steps)
    finally:
        store.close()
        if pool in slurm_cmd(slurm_conf, "scontrol", "show", "reservation", "-o"):
            slurm_cmd(slurm_conf, "scontrol", "delete", f"ReservationName={pool}")
        if "DRAIN" in node(slurm_conf, "gpu02")["State"]:
            slurm_cmd(slurm_conf, "scontrol", "update", "NodeName=gpu02", "State=RESUME")
