"""Elastic members Slurm reports dead (issue 33): the pure rule (:func:`elastic_todo`) and
its carrying out on a real (SQLite) store, with Slurm's changes recorded by a stand-in
client: drained with Slurm's words, an agent on the spare, each death once across restarts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from b300.elastic import host
from b300.elastic.members import JOINED, LEFT
from b300.elastic.reported import ElasticTodo, ReportedDeath, ReportedDeaths, elastic_todo, slurm_says_dead
from b300.events import Kind
from b300.interfaces import NewEvent, SlurmClient, Store
from b300.model import Attempt, AttemptState, NodeRecord
from b300.slurm.script import launch_dir
from b300.spec import dump_spec, parse_spec
from b300.store import open_store

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = """name = "el"
[job]
command = "train.py --steps 40"
nodes = 2
spare_nodes = 1
gpus_per_node = 0
[elastic]
min_nodes = 1
max_nodes = 2
max_restarts = 3
port = 29555
on_no_spare = "{on_no_spare}"
"""
ALLOC = ["n1", "n2", "n3"]


def _spec(on_no_spare: str = "shrink"):
    return parse_spec(SPEC.format(on_no_spare=on_no_spare), where="s.toml")


def _nodes(**states: str) -> dict[str, NodeRecord]:
    """``n2="DOWN|Not responding"``: a node record as the cycle's view holds it."""
    out = {n: NodeRecord(n, "ALLOCATED", "", T0) for n in ALLOC}
    for name, text in states.items():
        state, _, reason = text.partition("|")
        out[name] = NodeRecord(name, state, reason, T0)
    return out


@pytest.mark.parametrize(("state", "reason", "dead"), [
    ("DOWN", "Not responding", True),
    ("DOWN+DRAIN", "b300: node dead", True),
    ("FAIL", "admin", True),
    ("NOT_RESPONDING", "", True),
    ("MIXED", "Not responding", True),
    ("DRAINED", "maintenance", False),     # drained by someone: the agent runs on
    ("DRAINING", "b300: straggler", False),
    ("ALLOCATED", "", False),
    ("IDLE", "", False),
])
def test_what_slurm_calls_dead(state: str, reason: str, dead: bool) -> None:
    assert (slurm_says_dead(NodeRecord("n", state, reason, T0)) is not None) is dead
    assert slurm_says_dead(None) is None


def _todo(nodes: Mapping[str, NodeRecord], history: list[tuple[str, dict[str, object]]] | None = None, *,
          lost: tuple[str, ...] = (), plan: tuple[str, ...] = (), running: bool = True,
          on_no_spare: str = "shrink") -> ElasticTodo:
    return elastic_todo(_spec(on_no_spare), running=running, allocation=ALLOC, history=history or [],
                        lost=lost, nodes_now=nodes, plan_on_disk=plan)


def test_a_member_slurm_reports_down_is_a_death_to_act_on() -> None:
    todo = _todo(_nodes(n2="DOWN|Not responding"))
    assert todo == ElasticTodo((ReportedDeath("n2", "DOWN (Not responding)", True, True),))
    # The daemon's drain and its node_lost record already there: only the decision is left.
    todo = _todo(_nodes(n2="DOWN+DRAIN|b300: elastic member lost"), lost=("n2",))
    assert todo.deaths == (ReportedDeath("n2", "DOWN+DRAIN (b300: elastic member lost)", False, False),)


def test_an_idle_spare_or_a_member_already_gone_needs_nothing() -> None:
    assert _todo(_nodes(n3="DOWN|Not responding")).done            # the spare runs no agent
    history: list[tuple[str, dict[str, object]]] = [(LEFT, {"node": "n2", "then": "replace"}),
                                                     (JOINED, {"node": "n3"})]
    # n2 left before (the liveness path, or a cycle before a restart): never decided again.
    assert _todo(_nodes(n2="DOWN|Not responding"), history, plan=("n3",)).done
    # The spare, now a member, reported down: a death.
    todo = _todo(_nodes(n2="DOWN|x", n3="FAIL|y"), history, plan=("n3",))
    assert [d.node for d in todo.deaths] == ["n3"]


def test_the_recorded_plan_is_written_again_when_the_folder_lacks_it() -> None:
    history: list[tuple[str, dict[str, object]]] = [(LEFT, {"node": "n2", "then": "replace"}),
                                                     (JOINED, {"node": "n3"})]
    assert _todo(_nodes(n2="DOWN"), history, plan=()).plan == ("n3",)
    assert _todo(_nodes(n2="DOWN"), history, plan=("n3",)).plan is None


def test_a_recorded_fall_back_cancels_a_job_that_still_runs() -> None:
    history: list[tuple[str, dict[str, object]]] = [(LEFT, {"node": "n2", "then": "resubmit"})]
    assert _todo(_nodes(n2="DOWN"), history).cancel
    assert _todo(_nodes(n2="DOWN"), history, running=False).done


def test_a_run_without_elastic_needs_nothing() -> None:
    spec = parse_spec(SPEC.split("[elastic]")[0], where="s.toml")
    assert elastic_todo(spec, running=True, allocation=ALLOC, history=[], lost=(),
                        nodes_now=_nodes(n2="DOWN"), plan_on_disk=()).done


# -- carried out on a store -------------------------------------------------------


class Slurm:
    """Records what the daemon asks of Slurm (the two changes this path makes)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, ...]] = []

    def drain_node(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))

    def cancel(self, job_id: int) -> None:
        self.calls.append(("cancel", job_id))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/state.db")
    yield s
    s.close()


def _running(store: Store, on_no_spare: str = "shrink") -> Attempt:
    store.create_run("r1", "el", dump_spec(_spec(on_no_spare)), T0)
    a = store.begin_attempt("r1", T0)
    store.confirm_attempt(a.id, 40, T0)
    return store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=ALLOC, events=[NewEvent(
        Kind.ATTEMPT_STATE, run_id="r1", attempt_id=a.id, data={"job_id": 40, "from": "PENDING",
                                                                  "to": "RUNNING", "nodes": ALLOC})])


def _kinds(store: Store, kind: str) -> list[tuple[str | None, dict[str, object]]]:
    return [(e.node, dict(e.data)) for e in store.events(run_id="r1", kinds=[kind])]


def test_slurm_reported_death_drains_and_starts_an_agent_on_the_spare_once(
        store: Store, tmp_path: Path) -> None:
    attempt = _running(store)
    # Slurm took the DOWN node out of the --no-kill job: the job lists n1,n3 now.
    store.update_attempt(attempt.id, T0, nodes=["n1", "n3"])
    slurm = Slurm()
    deaths = ReportedDeaths(store, cast(SlurmClient, slurm), lambda: T0, log_dir=str(tmp_path / "logs"))
    nodes = _nodes(n2="DOWN|Not responding")
    assert deaths.reconcile(nodes) == 1
    assert slurm.calls == [("drain", "n2", "b300: elastic member lost: Slurm reports DOWN (Not responding)")]
    [(_, lost)] = _kinds(store, Kind.ATTEMPT_NODE_LOST)
    assert lost["nodes"] == ["n2"] and lost["evidence"] == "Slurm reports DOWN (Not responding)"
    [(_, left)] = _kinds(store, Kind.ELASTIC_MEMBER_LEFT)
    assert (left["node"], left["cause"], left["then"], left["members"]) == ("n2", "slurm", "replace", ["n1"])
    [(_, joined)] = _kinds(store, Kind.ELASTIC_MEMBER_JOINED)
    assert (joined["node"], joined["replaces"], joined["members"]) == ("n3", "n2", ["n1", "n3"])
    folder = launch_dir(str(tmp_path / "logs"), "r1", 1)
    assert host.read_plan(folder, 40) == (1, ["n3"])
    # The next cycles, and a new daemon (restarted: nothing in memory): nothing more.
    slurm_after = Slurm()
    again = ReportedDeaths(store, cast(SlurmClient, slurm_after), lambda: T0, log_dir=str(tmp_path / "logs"))
    drained = _nodes(n2="DOWN+DRAIN|b300: elastic member lost: Slurm reports DOWN (Not responding)")
    assert deaths.reconcile(drained) == 0 and again.reconcile(drained) == 0
    assert slurm_after.calls == [] and len(_kinds(store, Kind.ELASTIC_MEMBER_JOINED)) == 1
    # The plan lost (a crash between the events and the file): written again from the record.
    (Path(folder) / host.PLAN).unlink()
    assert again.reconcile(drained) == 1 and host.read_plan(folder, 40) == (1, ["n3"])
    assert len(_kinds(store, Kind.ELASTIC_MEMBER_JOINED)) == 1


def test_no_spare_and_resubmit_declared_cancels_the_job(store: Store, tmp_path: Path) -> None:
    _running(store, on_no_spare="resubmit")
    slurm = Slurm()
    deaths = ReportedDeaths(store, cast(SlurmClient, slurm), lambda: T0, log_dir=str(tmp_path / "logs"))
    # The spare went first (an idle spare: nothing), then a member: no spare is left.
    assert deaths.reconcile(_nodes(n3="DOWN|Not responding")) == 0
    assert deaths.reconcile(_nodes(n3="DOWN|x", n2="FAIL|bad dimm")) == 2
    assert slurm.calls[-1] == ("cancel", 40)
    [(_, left)] = _kinds(store, Kind.ELASTIC_MEMBER_LEFT)
    assert (left["node"], left["then"]) == ("n2", "resubmit")
    assert not _kinds(store, Kind.ELASTIC_MEMBER_JOINED)
