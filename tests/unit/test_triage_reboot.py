"""Triage's reboot step ([triage] reboot) and a passed node refilling a spare pool: the pure
decisions, and the effects (b300.triage.slurm.NodeTriage) against a recording stand-in for
Slurm with a real SQLite store, a daemon "killed" between any two steps by calling upkeep
again. The node states are the ones Slurm 22.05 showed on the local cluster for
``scontrol reboot ASAP nextstate=DOWN`` (sinfo %T: ``reboot``, ``reboot^``, ``down``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from b300.cycle.node_actions import rebooting
from b300.errors import SlurmError
from b300.events import TRIAGE, Kind
from b300.model import Event, JobObservation, NodeObservation, SlurmState, SubmitRequest
from b300.spares.pool import PoolView, pool_to_refill
from b300.store import open_store
from b300.store.sql_store import SqlStore
from b300.triage.checks import CheckTable, TriageConfig
from b300.triage.decide import FAILED, REBOOTED, SEND, WAIT, histories, reboot_phase
from b300.triage.slurm import NodeTriage

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
DEAD = "b300: node dead (b300d checks): no sshd"
REBOOT_EV = Event(id=5, ts=NOW - timedelta(seconds=30), kind=Kind.TRIAGE_REBOOT, run_id=None, attempt_id=None,
                  node="n1", actor="daemon", data={"job_id": 7})


def obs(state: str, reason: str = "", flags: str = "") -> NodeObservation:
    return NodeObservation("n1", state, reason, tuple(flags))


@pytest.mark.parametrize(("node", "phase"), [
    (obs("REBOOT", "b300: triage reboot after gpu-ecc failed"), WAIT),          # requested
    (obs("REBOOT", "...: reboot issued", "^"), WAIT),                             # issued
    (obs("MIXED", "", "@"), WAIT),                                                # pending, busy
    (obs("DOWN", "b300: triage reboot ... : reboot issued", "*"), WAIT),        # not answering yet
    (obs("DOWN", "b300: triage reboot ... : reboot issued : reboot complete"), REBOOTED),
    (obs("DOWN", "b300: triage reboot ... : reboot timed out"), FAILED),
    (obs("IDLE"), SEND),                                                          # never reached Slurm
    (obs("RESERVED"), SEND),
    (None, WAIT),
])
def test_the_reboot_phase_is_read_from_slurm_alone(node: NodeObservation | None, phase: str) -> None:
    assert reboot_phase(node, REBOOT_EV, NOW, 1800.0)[0] == phase


def test_a_reboot_that_never_ends_fails_at_its_timeout() -> None:
    late = NOW + timedelta(seconds=1800)
    assert reboot_phase(obs("REBOOT", flags="^"), REBOOT_EV, late, 1800.0)[0] == FAILED
    assert reboot_phase(obs("IDLE"), REBOOT_EV, late, 1800.0)[0] == FAILED
    assert reboot_phase(None, REBOOT_EV, late, 1800.0)[0] == FAILED
    assert rebooting(obs("REBOOT")) and rebooting(obs("IDLE", flags="@")) and not rebooting(obs("DOWN"))


def test_a_reboot_belongs_to_the_open_triage_only() -> None:
    def ev(i: int, kind: str) -> Event:
        return Event(id=i, ts=NOW, kind=kind, run_id=None, attempt_id=None, node="n1", actor="d", data={})

    h = histories([ev(1, Kind.TRIAGE_STARTED), ev(2, Kind.TRIAGE_REBOOT)])["n1"]
    assert h.rebooted is not None and h.rebooted.id == 2
    h = histories([ev(1, Kind.TRIAGE_STARTED), ev(2, Kind.TRIAGE_REBOOT), ev(3, Kind.TRIAGE_VERDICT),
                   ev(4, Kind.TRIAGE_STARTED)])["n1"]
    assert h.open and h.rebooted is None      # the earlier triage's reboot does not count


def test_a_passed_node_goes_to_the_first_short_pool_of_its_partition() -> None:
    idle = {"a1": "IDLE", "a2": "IDLE", "b1": "IDLE", "x": "DRAINED"}
    gpu = PoolView("b300-spares-gpu", 2, {"a1", "a2", "n1"}, ("a1",))
    full = PoolView("b300-spares-big", 1, {"b1", "n1"}, ("b1",))
    assert pool_to_refill("n1", [full, gpu], idle, ()) == "b300-spares-gpu"
    assert pool_to_refill("n1", [gpu], idle, {"n1"}) is None          # drifted/black hole: no pool
    assert pool_to_refill("n2", [gpu], idle, ()) is None              # not in its partition
    assert pool_to_refill("n1", [PoolView("p", 2, {"n1"}, ("a1", "a2"))], idle, ()) is None   # full
    # a drained member does not count; a promised node does
    assert pool_to_refill("n1", [PoolView("p", 2, {"n1"}, ("a1", "x"))], idle, ()) == "p"
    assert pool_to_refill("n1", [PoolView("p", 2, {"n1"}, ("a1", "a2"), promised=1)], idle, ()) == "p"
    # already in it (a daemon killed between adding it and resuming it): that pool
    assert pool_to_refill("n1", [full, PoolView("p", 1, {"n1"}, ("a1", "n1"))], idle, ()) == "p"


# -- the effects, against a stand-in Slurm -------------------------------------------------


@dataclass
class Cluster:
    """The Slurm calls NodeTriage makes, recorded; the node's state is set by the test."""

    state: NodeObservation = field(default_factory=lambda: NodeObservation("n1", "DRAINED", DEAD))
    jobs: list[JobObservation] = field(default_factory=list)
    reservations: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    refuse_reboot: bool = False

    def nodes(self) -> list[NodeObservation]:
        return [self.state]

    def default_partition(self) -> str | None:
        return "batch"

    def find_by_name(self, job_name: str, since: datetime | None = None) -> list[JobObservation]:
        return [j for j in self.jobs if j.name == job_name]

    def reservation_list(self) -> str:
        return "\n".join(f"ReservationName={r} Nodes=n1 Users=root" for r in sorted(self.reservations))

    def create_reservation(self, name: str, nodes: Sequence[str], *, users: str, partition: str) -> None:
        self.calls.append(f"reserve {name}")
        self.reservations.add(name)

    def delete_reservation(self, name: str) -> None:
        self.calls.append(f"unreserve {name}")
        self.reservations.discard(name)

    def resume_node(self, node: str) -> None:
        self.calls.append("resume")
        self.state = NodeObservation("n1", "IDLE")

    def drain_node(self, node: str, reason: str) -> None:
        self.calls.append(f"drain {reason}")
        self.state = NodeObservation("n1", "DRAINED", reason)

    def reboot_node(self, node: str, reason: str) -> None:
        if self.refuse_reboot:
            raise SlurmError("RebootProgram isn't defined", transient=False)
        self.calls.append("reboot")
        self.state = NodeObservation("n1", "REBOOT", reason)

    def submit(self, request: SubmitRequest) -> int:
        job_id = 100 + len(self.jobs)
        self.jobs.append(JobObservation(job_id, SlurmState.RUNNING, name=request.job_name))
        self.calls.append(f"submit {job_id}")
        return job_id

    def end_job(self, exit_code: int) -> None:
        j = self.jobs[-1]
        self.jobs[-1] = JobObservation(j.job_id, SlurmState.COMPLETED, name=j.name, exit_code=exit_code)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


def _triage(store: SqlStore, cluster: Cluster, tmp_path: Path, clock: list[datetime],
            cfg: TriageConfig) -> NodeTriage:
    return NodeTriage(store, cluster, lambda: clock[0], lambda: cfg,  # type: ignore[arg-type]
                      job_log_dir=str(tmp_path / "logs"), act=True)


def _finish(tmp_path: Path, cluster: Cluster, ok: bool) -> None:
    """The job's output: the check line and its step line, then the job ends."""
    status = "pass" if ok else "fail"
    out = tmp_path / "logs" / "b300-triage-n1.out"
    out.write_text(f'{{"check": "gpu-ecc", "status": "{status}", "evidence": "2 uncorrectable"}}\n'
                   f'{{"step": "node-check", "exit": {0 if ok else 1}}}\n')
    cluster.end_job(0 if ok else 1)


CFG = TriageConfig(enabled=True, reboot=True, interval_s=1.0,
                   check=[CheckTable(name="node-check", timeout_s=60)])


def _kinds(store: SqlStore) -> list[str]:
    return [e.kind for e in store.events(kinds=list(TRIAGE)) if e.kind != Kind.NODE_DRAINED]


@pytest.mark.parametrize("second_ok", [True, False])
def test_a_failed_node_is_rebooted_once_then_checked_again(store: SqlStore, tmp_path: Path,
                                                          second_ok: bool) -> None:
    cluster, clock = Cluster(), [NOW]
    t = _triage(store, cluster, tmp_path, clock, CFG)
    assert t.upkeep(force=True) == 1 and cluster.calls == ["reserve b300-triage-n1", "resume", "submit 100"]
    _finish(tmp_path, cluster, ok=False)
    assert t.upkeep(force=True) == 1 and cluster.calls[-1] == "reboot"
    # Killed right after: Slurm shows the reboot requested, then issued: never sent again.
    for state, flags in (("REBOOT", ""), ("REBOOT", "^"), ("DOWN", "*")):
        cluster.state = NodeObservation("n1", state, "b300: triage reboot after gpu-ecc failed", tuple(flags))
        t = _triage(store, cluster, tmp_path, clock, CFG)
        assert t.upkeep(force=True) == 0
    assert cluster.calls.count("reboot") == 1
    # Back, DOWN (nextstate=DOWN): resumed in its reservation and checked again.
    cluster.state = NodeObservation("n1", "DOWN", "b300: triage reboot ... : reboot complete")
    assert t.upkeep(force=True) == 1 and cluster.calls[-2:] == ["resume", "submit 101"]
    _finish(tmp_path, cluster, ok=second_ok)
    assert t.upkeep(force=True) == 1
    v = [e for e in store.events(kinds=[Kind.TRIAGE_VERDICT])][-1].data
    assert v["rebooted"] is True and v["job_id"] == 101 and cluster.calls.count("reboot") == 1
    assert v["verdict"] == ("pass" if second_ok else "fail")
    assert "reboot" in v["evidence"] and "before it" in v["evidence"]
    assert _kinds(store) == [Kind.TRIAGE_STARTED, Kind.TRIAGE_REBOOT, Kind.TRIAGE_STARTED, Kind.TRIAGE_VERDICT,
                             *([Kind.NODE_RESUMED] if second_ok else [])]
    assert ("drain b300: triage failed gpu-ecc" in cluster.calls[-2]) is not second_ok
    assert cluster.reservations == set()


def test_a_reboot_killed_before_it_reached_slurm_is_sent_then(store: SqlStore, tmp_path: Path) -> None:
    cluster, clock = Cluster(), [NOW]
    t = _triage(store, cluster, tmp_path, clock, CFG)
    t.upkeep(force=True)
    _finish(tmp_path, cluster, ok=False)
    cluster.reboot_node = lambda node, reason: None   # type: ignore[method-assign]  # killed before
    t.upkeep(force=True)
    assert [e.kind for e in store.events(kinds=[Kind.TRIAGE_REBOOT])] == [Kind.TRIAGE_REBOOT]
    del cluster.reboot_node
    assert "reboot" not in cluster.calls and cluster.state.state == "IDLE"
    assert t.upkeep(force=True) == 1 and cluster.calls.count("reboot") == 1
    assert t.upkeep(force=True) == 0 and cluster.calls.count("reboot") == 1


def test_a_cluster_without_reboot_program_fails_the_node_at_once(store: SqlStore, tmp_path: Path) -> None:
    cluster, clock = Cluster(refuse_reboot=True), [NOW]
    t = _triage(store, cluster, tmp_path, clock, CFG)
    t.upkeep(force=True)
    _finish(tmp_path, cluster, ok=False)
    assert t.upkeep(force=True) == 1
    v = [e for e in store.events(kinds=[Kind.TRIAGE_VERDICT])][-1].data
    assert (v["verdict"], v["failed_check"], v["rebooted"]) == ("fail", "gpu-ecc", False)
    assert "reboot refused by Slurm: RebootProgram isn't defined" in v["evidence"]
    assert cluster.calls[-2].startswith("drain b300: triage failed gpu-ecc") and cluster.reservations == set()


def test_a_reboot_that_does_not_come_back_fails_the_node(store: SqlStore, tmp_path: Path) -> None:
    cluster, clock = Cluster(), [NOW]
    t = _triage(store, cluster, tmp_path, clock, CFG)
    t.upkeep(force=True)
    _finish(tmp_path, cluster, ok=False)
    t.upkeep(force=True)
    clock[0] = NOW + timedelta(seconds=CFG.reboot_timeout_s + 1)
    assert t.upkeep(force=True) == 1
    v = [e for e in store.events(kinds=[Kind.TRIAGE_VERDICT])][-1].data
    assert (v["verdict"], v["failed_check"], v["rebooted"]) == ("fail", "reboot", True)
    assert cluster.calls[-2].startswith("drain b300: triage failed reboot")
    assert cluster.calls.count("reboot") == 1


def test_without_reboot_a_failed_check_is_the_verdict(store: SqlStore, tmp_path: Path) -> None:
    cluster, clock = Cluster(), [NOW]
    t = _triage(store, cluster, tmp_path, clock, CFG.model_copy(update={"reboot": False}))
    t.upkeep(force=True)
    _finish(tmp_path, cluster, ok=False)
    assert t.upkeep(force=True) == 1 and "reboot" not in cluster.calls
    assert [e.data["verdict"] for e in store.events(kinds=[Kind.TRIAGE_VERDICT])] == ["fail"]


@dataclass
class Pools:
    short: str | None
    cluster: Cluster
    taken: list[tuple[str, str]] = field(default_factory=list)

    def short_pool_for(self, node: str) -> str | None:
        return self.short

    def take(self, reservation: str, node: str) -> None:
        self.cluster.calls.append(f"pool {reservation}")
        self.taken.append((reservation, node))


@pytest.mark.parametrize("short", ["b300-spares-batch", None])
def test_a_passed_node_refills_a_short_pool_first(store: SqlStore, tmp_path: Path, short: str | None) -> None:
    cluster, clock = Cluster(), [NOW]
    pools = Pools(short, cluster)
    t = NodeTriage(store, cluster, lambda: clock[0], lambda: CFG,  # type: ignore[arg-type]
                   job_log_dir=str(tmp_path / "logs"), act=True, pools=pools)
    t.upkeep(force=True)
    _finish(tmp_path, cluster, ok=True)
    del cluster.calls[:]
    assert t.upkeep(force=True) == 1
    v = [e for e in store.events(kinds=[Kind.TRIAGE_VERDICT])][-1].data
    if short:
        # drained while it moves: no queued job lands on it between the two reservations
        assert cluster.calls == ["drain b300: triage passed, into spare pool b300-spares-batch",
                                 "unreserve b300-triage-n1", "pool b300-spares-batch", "resume"]
        assert v["pool"] == short and pools.taken == [(short, "n1")]
    else:
        assert cluster.calls == ["unreserve b300-triage-n1"] and "pool" not in v
    assert (v["verdict"], v["resumed"]) == ("pass", True)
