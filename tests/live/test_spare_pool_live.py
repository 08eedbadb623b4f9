"""The daemon-held spare pool (issue 15, the fallback), end to end on a 6-node cluster.

``[spares]`` keeps 2 idle nodes of partition ``batch`` in the reservation
``b300-spares-batch``. A 2-node run (no ``spare_nodes``) runs outside it; every other
node is busy with another user's long job, and one more of theirs waits. A node of the
run is set DOWN: the run is resubmitted into the reservation and its new job starts at
once, while the other user's long job still runs and their waiting job still waits. A
restarted daemon adopts the reservation.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from test_spares_live import OTHER_USER, TRAIN, _other_user, six_nodes

from b300.slurm.parse import expand_nodes
from helpers import DaemonHandle, make_daemon, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
POOL = "b300-spares-batch"
__all__ = ["six_nodes"]   # the 6-node cluster fixture, when the suite's has fewer nodes


@pytest.fixture
def conf(slurm_conf: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A cluster of 6+ nodes: the suite's (B300_NODES=6), else test_spares_live's own."""
    nodes = slurm_cmd(slurm_conf, "sinfo", "--noheader", "--Node", "--format=%N").split()
    chosen = slurm_conf if len(set(nodes)) >= 6 else str(request.getfixturevalue("six_nodes"))
    yield chosen
    subprocess_quiet(chosen, "scontrol", "delete", f"ReservationName={POOL}")


def subprocess_quiet(conf: str, *argv: str) -> None:
    import os
    import subprocess

    subprocess.run(list(argv), capture_output=True, timeout=30, check=False,
                   env={**os.environ, "SLURM_CONF": conf})


def _spec(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    command = (f"srun {sys.executable} {TRAIN} --steps 60 --ckpt-every 5 --step-time 0.3")
    spec = tmp_path / "pool.toml"
    spec.write_text("\n".join([
        'name = "pool"', "[job]", f"command = {json.dumps(command)}", "nodes = 2",
        'partition = "batch"', "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
        "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[health]", f'progress_file = "{run_dir / "progress.json"}"',
        "[retries]", "infra = 3",
    ]) + "\n")
    return spec


def _daemon(tmp_path: Path, conf: str, pool: int = 2) -> DaemonHandle:
    d = make_daemon(tmp_path, conf, poll_interval="1s")
    with d.config.open("a") as f:
        f.write('[recovery]\nsettle = "5s"\n[spares]\nenabled = true\nrefill_interval_s = 2.0\n'
                f'[[spares.pool]]\npartition = "batch"\nnodes = {pool}\n')
    return d


def _pool_nodes(conf: str) -> list[str]:
    from b300.spares.pool import parse_reservations

    found = [r for r in parse_reservations(slurm_cmd(conf, "scontrol", "show", "reservation", "-o"))
             if r.name == POOL]
    return list(found[0].nodes) if found else []


def _job(conf: str, job_id: int) -> dict[str, str]:
    out = slurm_cmd(conf, "squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%v|%S|%e|%N")
    state, resv, start, end, nodes = out.strip().split("|")
    return {"state": state, "reservation": resv, "start": start, "end": end, "nodes": nodes}


def _progress(tmp_path: Path) -> int:
    try:
        return int(json.loads((tmp_path / "run" / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def test_a_resubmitted_run_starts_at_once_in_the_spare_pool(tmp_path: Path, conf: str) -> None:
    d = _daemon(tmp_path, conf)
    busy: list[int] = []
    victim = ""
    d.start()
    try:
        wait_for(lambda: len(_pool_nodes(conf)) == 2, 60, "the daemon to create its 2-node pool")
        pool = _pool_nodes(conf)
        run_id = d.submit(_spec(tmp_path))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        assert not set(first["nodes"]) & set(pool), (first, pool)   # the pool is no queue
        all_nodes = set(slurm_cmd(conf, "sinfo", "--noheader", "--Node", "--format=%N").split())
        others = sorted(all_nodes - set(first["nodes"]) - set(pool))
        busy.append(_other_user(conf, f"--nodes={len(others)}", f"--nodelist={','.join(others)}",
                                "--time=20", "--wrap", "sleep 900"))
        busy.append(_other_user(conf, "--nodes=2", "--wrap", "sleep 60"))
        wait_for(lambda: _job(conf, busy[0])["state"] == "RUNNING", 60, "the other user's job")
        # The other user cannot use the pool, nor can their waiting job start in it.
        assert _job(conf, busy[1])["state"] == "PENDING"
        wait_for(lambda: _progress(tmp_path) >= 7, 120, "training past the first checkpoint")
        victim = first["nodes"][-1]
        slurm_cmd(conf, "scontrol", "update", f"NodeName={victim}", "State=DOWN",
                  "Reason=test-node-failure")
        lost_at = datetime.now().astimezone()
        wait_for(lambda: len(d.run(run_id)["attempts"]) >= 2
                 and d.run(run_id)["attempts"][1]["state"] == "RUNNING", 120,
                 "the resubmitted job running")
        status = d.run(run_id)
        a2 = status["attempts"][1]
        job = _job(conf, a2["job_id"])
        assert job["reservation"] == POOL and set(a2["nodes"]) <= set(pool), (job, a2, pool)
        # Started while the other user's long job runs (it ends in ~15 min) and their
        # waiting job waits or runs outside the pool: nothing of the queue was waited for.
        other = _job(conf, busy[0])
        waiting = _job(conf, busy[1])
        assert other["state"] == "RUNNING", other
        # Their waiting job may take the run's old nodes (the DOWN one comes back: slurmd
        # still answers), never the pool's.
        assert waiting["state"] == "PENDING" or not set(expand_nodes(waiting["nodes"])) & set(pool)
        started = datetime.fromisoformat(job["start"]).astimezone()
        assert started < datetime.fromisoformat(other["end"]).astimezone()
        [intent] = [e for e in status["events"] if e["kind"] == "attempt.intent"
                    and e["data"].get("resubmit")]
        assert intent["data"]["reservation"] == POOL and victim in intent["data"]["exclude"]
        [used] = [e for e in status["events"] if e["kind"] == "spares.used"]
        assert used["data"]["job_id"] == a2["job_id"] and used["data"]["needed"] == 2
        [resub] = [e for e in status["events"] if e["kind"] == "recovery.resubmit"]
        assert resub["data"]["outcome"] == "INFRA"
        print(f"\nspare pool: node DOWN -> new job started in {POOL} "
              f"{(started - lost_at).total_seconds():.1f} s (squeue start, 1 s resolution); "
              f"the other user's job ends at {other['end']}")
        # Refilled: the job keeps its nodes reserved, and free healthy nodes are added once
        # the other user's waiting job (which may hold the run's old nodes) is gone.
        slurm_cmd(conf, "scancel", str(busy[1]))
        survivor = next(n for n in first["nodes"] if n != victim)
        wait_for(lambda: survivor in _pool_nodes(conf), 60, "the survivor added to the pool")
        victim_state = slurm_cmd(conf, "sinfo", "--noheader", "--Node", f"--nodes={victim}",
                                 "--format=%T").strip()
        assert "drain" in victim_state and victim not in _pool_nodes(conf), victim_state
        assert set(_pool_nodes(conf)) == set(pool) | {survivor}
        last = d.ctl("events", "--kind", "spares.pool")[-1]["data"]
        assert last["idle"] == [survivor] and set(last["held"]) == set(a2["nodes"])
        assert last["short"] == 1     # every other node is busy (or drained)
        text = d.ctl_raw("nodes").stdout
        assert POOL in text and "SPARE POOL" in text, text
        # A restart adopts the reservation (Slurm state) instead of making a new one.
        d.kill(signal.SIGTERM)
        d.start()
        wait_for(lambda: any(e["data"].get("adopted") for e in d.ctl("events", "--kind", "spares.pool")),
                 60, "the restarted daemon to adopt the pool")
        assert set(_pool_nodes(conf)) == set(pool) | {survivor}
        done = d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert done["run"]["state"] == "COMPLETED", done["events"][-6:]
        assert OTHER_USER and _job(conf, busy[0])["state"] == "RUNNING"
    finally:
        d.cleanup()
        if busy:
            slurm_cmd(conf, "scancel", *map(str, busy))
        if victim:
            subprocess_quiet(conf, "scontrol", "update", f"NodeName={victim}", "State=RESUME")


def test_a_pool_too_small_for_the_job_leaves_the_plain_resubmission(tmp_path: Path, conf: str) -> None:
    """K = 1 for a 2-node run: the new job goes to the queue (and waits there: every
    other node is busy), and the pool's node is not handed to it nor to anyone else."""
    d = _daemon(tmp_path, conf, pool=1)
    busy: list[int] = []
    victim = ""
    d.start()
    try:
        wait_for(lambda: len(_pool_nodes(conf)) == 1, 60, "the daemon to create its 1-node pool")
        pool = _pool_nodes(conf)
        run_id = d.submit(_spec(tmp_path))
        first = d.wait_run(run_id, {"RUNNING"}, timeout=120)["attempts"][0]
        all_nodes = set(slurm_cmd(conf, "sinfo", "--noheader", "--Node", "--format=%N").split())
        others = sorted(all_nodes - set(first["nodes"]) - set(pool))
        busy.append(_other_user(conf, f"--nodes={len(others)}", f"--nodelist={','.join(others)}",
                                "--time=20", "--wrap", "sleep 900"))
        wait_for(lambda: _job(conf, busy[0])["state"] == "RUNNING", 60, "the other user's job")
        wait_for(lambda: _progress(tmp_path) >= 7, 120, "training past the first checkpoint")
        victim = first["nodes"][-1]
        slurm_cmd(conf, "scontrol", "update", f"NodeName={victim}", "State=DOWN",
                  "Reason=test-node-failure")
        wait_for(lambda: len(d.run(run_id)["attempts"]) >= 2
                 and d.run(run_id)["attempts"][1]["job_id"] is not None, 120, "the resubmission")
        status = d.run(run_id)
        a2 = status["attempts"][1]
        [intent] = [e for e in status["events"] if e["kind"] == "attempt.intent"
                    and e["data"].get("resubmit")]
        assert "reservation" not in intent["data"], intent
        assert not [e for e in status["events"] if e["kind"] == "spares.used"]
        job = _job(conf, a2["job_id"])
        assert job["reservation"] == "(null)", job
        # It waits for a second node (the victim is drained, the rest busy); the pool's idle
        # node stays in the pool, unused, through several refills.
        for _ in range(5):
            time.sleep(1.0)
            assert _job(conf, a2["job_id"])["state"] == "PENDING"
            assert _pool_nodes(conf) == pool
        idle = slurm_cmd(conf, "sinfo", "--noheader", "--Node", f"--nodes={pool[0]}", "--format=%T")
        assert idle.strip() in {"idle", "reserved"}, idle
    finally:
        d.cleanup()
        if busy:
            slurm_cmd(conf, "scancel", *map(str, busy))
        if victim:
            subprocess_quiet(conf, "scontrol", "update", f"NodeName={victim}", "State=RESUME")


def _pool_flags(conf: str) -> str:
    from b300.spares.pool import parse_reservations

    found = [r for r in parse_reservations(slurm_cmd(conf, "scontrol", "show", "reservation", "-o"))
             if r.name == POOL]
    return found[0].flags if found else ""


def test_an_adopted_pool_without_no_hold_jobs_after_end_gets_the_flag(tmp_path: Path, conf: str) -> None:
    """A pool made by an older b300d (no flag): the daemon adopts it and adds
    NO_HOLD_JOBS_AFTER_END, without which deleting it would hold the jobs pending in it."""
    import getpass

    node = sorted(set(slurm_cmd(conf, "sinfo", "--noheader", "--Node", "--format=%N").split()))[-1]
    slurm_cmd(conf, "scontrol", "create", "reservation", f"ReservationName={POOL}",
              f"Users={getpass.getuser()}", "PartitionName=batch", f"Nodes={node}",
              "StartTime=now", "Duration=infinite")
    assert "NO_HOLD_JOBS_AFTER_END" not in _pool_flags(conf)
    d = _daemon(tmp_path, conf, pool=1)
    d.start()
    try:
        wait_for(lambda: "NO_HOLD_JOBS_AFTER_END" in _pool_flags(conf), 60,
                 "the daemon to add NO_HOLD_JOBS_AFTER_END to the adopted pool")
        assert _pool_nodes(conf) == [node]
    finally:
        d.cleanup()


def test_a_deferred_pooled_intent_is_placed_again_only_if_the_pool_still_fits(
        tmp_path: Path, conf: str) -> None:
    """Two runs whose intents chose the same 2-node pool (a crash, or a deferred sbatch,
    between intent and sbatch): the first resolved finds the pool's 2 nodes promised to
    the other one and goes to the queue (``spares.used`` with ``dropped``); the second
    then fits and goes into the pool. Real Slurm, real store: nothing is faked."""
    from datetime import UTC, timedelta

    from b300.cycle.run_actions import RunActions, new_run_id
    from b300.events import Kind
    from b300.interfaces import NewEvent
    from b300.plugin_registry import PluginRegistry
    from b300.slurm import make_slurm_client
    from b300.spares.pool_config import load_spares_config
    from b300.spares.pools import SparePools
    from b300.store import open_store

    slurm = make_slurm_client("cli", slurm_conf=conf, bin_dir=None, timeout=30.0,
                              plugins=PluginRegistry())
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    now = datetime.now(UTC)
    cfg = load_spares_config({"enabled": True, "refill_interval_s": 1.0,
                              "pool": [{"partition": "batch", "nodes": 2}]})
    pools = SparePools(store, slurm, lambda: now, lambda: cfg)
    jobs: list[int] = []
    try:
        [plan] = pools.upkeep(force=True)
        assert len(plan.idle) == 2 and "NO_HOLD_JOBS_AFTER_END" in _pool_flags(conf)
        spec = "\n".join(['name = "pooled"', "[job]", 'command = "sleep 300"', "nodes = 2",
                          'partition = "batch"', "ntasks_per_node = 1", 'time_limit = "00:10:00"']) + "\n"
        attempts = []
        for _ in range(2):
            run_id = new_run_id("pooled")
            store.create_run(run_id, "pooled", spec, now - timedelta(minutes=5))
            attempts.append(store.begin_attempt(run_id, now - timedelta(minutes=5), events=[
                NewEvent(Kind.ATTEMPT_INTENT, run_id=run_id, data={
                    "resubmit": True, "exclude": [], "reservation": POOL})]))
        actions = RunActions(store, slurm, lambda: now, submit_grace_s=60.0,
                             spares=pools.placement)
        first = actions.resolve_intent(attempts[0])
        second = actions.resolve_intent(attempts[1])
        assert first.slurm_job_id is not None and second.slurm_job_id is not None
        jobs += [first.slurm_job_id, second.slurm_job_id]
        assert _job(conf, first.slurm_job_id)["reservation"] == "(null)"
        assert _job(conf, second.slurm_job_id)["reservation"] == POOL
        used = [e.data for e in store.events(run_id=first.run_id, kinds=[Kind.SPARES_USED])]
        assert used and used[0]["dropped"] is True, used
    finally:
        if jobs:
            subprocess_quiet(conf, "scancel", *map(str, jobs))
            wait_for(lambda: not slurm_cmd(conf, "squeue", "--noheader",
                                           f"--jobs={','.join(map(str, jobs))}").strip(),
                     60, "the test's jobs to end (the pool is then deleted)")
        store.close()


def test_spares_follow_a_reload_and_a_spec_without_partition_uses_the_default_pool(
        tmp_path: Path, slurm_conf: str) -> None:
    """``[spares]`` is live: a pool a reload adds is made at the next upkeep, one it drops
    has its reservation deleted (and leaves ``b300ctl nodes`` and the metric). A spec that
    names no partition runs in the cluster's default one (``batch`` here): it is placed in
    that partition's pool. Real Slurm and a real store."""
    from datetime import UTC

    from b300.cli.nodes import spare_pools
    from b300.events import Kind
    from b300.plugin_registry import PluginRegistry
    from b300.slurm import make_slurm_client
    from b300.spares.pool_config import load_spares_config
    from b300.spares.pools import SparePools
    from b300.spec import parse_spec
    from b300.store import open_store

    conf = slurm_conf
    slurm = make_slurm_client("cli", slurm_conf=conf, bin_dir=None, timeout=30.0,
                              plugins=PluginRegistry())
    assert slurm.default_partition() == "batch"
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    now = datetime.now(UTC)
    off = load_spares_config({})
    on = load_spares_config({"enabled": True, "refill_interval_s": 1.0,
                             "pool": [{"partition": "batch", "nodes": 1}]})
    current = [off]
    pools = SparePools(store, slurm, lambda: now, lambda: current[0], user="")
    spec = parse_spec("\n".join(['name = "nopart"', "[job]", 'command = "sleep 300"', "nodes = 1",
                                 "ntasks_per_node = 1"]) + "\n", where="spec")
    try:
        assert pools.upkeep(force=True) == [] and _pool_nodes(conf) == []
        assert pools.placement(spec, ()) is None
        current[0] = on                                    # a reload turns the pool on
        [plan] = pools.upkeep(force=True)
        assert len(plan.idle) == 1 and _pool_nodes(conf) == list(plan.idle)
        placed = pools.placement(spec, ())                 # no partition: the default's pool
        assert placed is not None and placed.reservation == POOL and placed.partition == "batch"
        assert [p["reservation"] for p in spare_pools(store.events(kinds=[Kind.SPARES_POOL]))] == [POOL]
        current[0] = off                                   # a reload turns it off again
        assert pools.upkeep(force=True) == []
        assert _pool_nodes(conf) == [], "the dropped pool's reservation is deleted"
        last = store.events(kinds=[Kind.SPARES_POOL])[-1].data
        assert last["retired"] is True and last["nodes"] == []
        assert spare_pools(store.events(kinds=[Kind.SPARES_POOL])) == []
        assert pools.upkeep(force=True) == []              # nothing left to retire: no call
        # A pool left by an earlier config is deleted by a daemon started without it.
        current[0] = on
        pools.upkeep(force=True)
        assert len(_pool_nodes(conf)) == 1
        current[0] = off
        restarted = SparePools(store, slurm, lambda: now, lambda: current[0], user="")
        assert restarted.upkeep(force=True) == [] and _pool_nodes(conf) == []
    finally:
        subprocess_quiet(conf, "scontrol", "delete", f"ReservationName={POOL}")
        store.close()
