"""``[training] straggler_action = "drain"`` (b300.recovery.straggler_drain): the decision
(pure), and the watch draining a real node of the local Slurm cluster once, with the
evidence as its reason, recorded with the finding; the per-run limit; a daemon that died
between the drain and its record; the default never draining."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from b300.errors import ConfigError
from b300.model import Attempt, AttemptState, NodeObservation, NodeRecord
from b300.recovery.classify import Outcome, classify_end, node_is_bad
from b300.recovery.straggler_drain import (
    StragglerDrainer,
    drain_refusal,
    straggler_drained,
    straggler_reason,
)
from b300.slurm.cli import CliSlurmClient
from b300.spec import dump_spec, parse_spec, spec_of
from b300.store import SqlStore, open_store
from b300.training.health_step import TrainingWatch
from b300.training.thresholds import TrainingConfig, load_training_config

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
DRAIN = TrainingConfig.model_validate({"straggler": {"steps": 5}, "straggler_action": "drain",
                                       "straggler_drain_every": "6h"})


def _node(name: str, state: str = "IDLE", reason: str = "") -> NodeRecord:
    return NodeRecord(name=name, state=state, reason=reason, updated_at=T0)


def _refusal(**kw: object) -> str | None:
    args: dict[str, object] = dict(
        host="gpu02", run_id="r-1", attempt_nodes=("gpu01", "gpu02"),
        nodes_now={n: _node(n, "ALLOCATED") for n in ("gpu01", "gpu02")} | {"gpu03": _node("gpu03")},
        last_drain=None, every_s=6 * 3600.0, now=T0, partition=["gpu01", "gpu02", "gpu03"],
        excluded=(), needed=2)
    args.update(kw)
    return drain_refusal(**args)  # type: ignore[arg-type]


def test_the_decision() -> None:
    assert _refusal() is None
    assert "not a Slurm node of the attempt" in (_refusal(host="worker-7") or "")
    drained = {"gpu02": _node("gpu02", "DRAINED", "xid 79")}
    assert "drained already (xid 79)" in (_refusal(nodes_now=drained) or "")
    # Drained by this run's straggler policy before a crash: not "someone else's" drain.
    ours = {"gpu02": _node("gpu02", "MIXED+DRAIN", straggler_reason("r-1", 7, "slow")),
            "gpu03": _node("gpu03")}
    assert _refusal(nodes_now=ours) is None
    assert "at most one per 6 h" in (_refusal(last_drain=T0 - timedelta(hours=5)) or "")
    assert _refusal(last_drain=T0 - timedelta(hours=7)) is None
    assert "partition nodes are unknown" in (_refusal(partition=None) or "")
    # gpu03 down: draining gpu02 leaves gpu01 alone for a 2-node run.
    down = {"gpu03": _node("gpu03", "DOWN", "not responding")}
    assert "leave 1 usable node(s)" in (_refusal(nodes_now=down) or "")
    assert "leave 1 usable node(s)" in (_refusal(excluded=["gpu03"]) or "")
    assert "the run needs 3" in (_refusal(needed=3) or "")


def test_a_job_error_on_a_straggler_drained_node_stays_a_job_error(store: SqlStore, tmp_path: Path) -> None:
    """A run whose straggler was drained fails of its own bug later: that is not an
    infrastructure failure of the drained node (no strike, no resubmission for it)."""
    attempt = _attempt(store, tmp_path, "r-1")
    ended = store.update_attempt(attempt.id, T0, state=AttemptState.FAILED, exit_code=1, end=T0)
    spec = spec_of(store.get_run("r-1"))
    nodes = {"gpu01": _node("gpu01", "IDLE"),
             "gpu02": _node("gpu02", "DRAINED", straggler_reason("r-1", 4242, "slow"))}
    log = ["Traceback (most recent call last):", "ValueError: bad batch",
           "srun: error: gpu01: task 0: Exited with exit code 1"]

    def verdict(drained: set[str]) -> Outcome:
        return classify_end(ended, spec, nodes, log, cancel_requested=False, hang_detected=False,
                            now=T0, settle_s=0, drained_working=drained).outcome

    seen = {"gpu01": NodeObservation("gpu01", "IDLE"),
            "gpu02": NodeObservation("gpu02", "DRAINED", straggler_reason("r-1", 4242, "slow"))}
    assert verdict(set()) is Outcome.INFRA  # what a plain drain would make of it
    assert verdict(straggler_drained(ended.nodes, seen, "r-1")) is Outcome.JOB_ERROR
    # The same node down as well: a failure again.
    seen["gpu02"] = NodeObservation("gpu02", "DOWN", straggler_reason("r-1", 4242, "slow"))
    assert verdict(straggler_drained(ended.nodes, seen, "r-1")) is Outcome.INFRA


def test_a_straggler_drained_node_that_died_is_a_suspect(store: SqlStore, tmp_path: Path) -> None:
    """Slurm shows a DOWN+DRAIN node as ``drained*`` and keeps our reason (seen on the local
    cluster: ``gpu04|drained*|b300: straggler in run ...`` after kill-node): the ``*`` of
    the live observation, or b300d's checks finding it dead, take the exemption away."""
    attempt = _attempt(store, tmp_path, "r-1")
    ended = store.update_attempt(attempt.id, T0, state=AttemptState.FAILED, exit_code=1, end=T0)
    spec = spec_of(store.get_run("r-1"))
    reason = straggler_reason("r-1", 4242, "slow")
    nodes = {"gpu01": _node("gpu01", "IDLE"), "gpu02": _node("gpu02", "DRAINED", reason)}  # as stored
    log = ["Traceback (most recent call last):", "ValueError: bad batch",
           "srun: error: gpu01: task 0: Exited with exit code 1"]

    def verdict(drained: set[str], **kw: object) -> tuple[Outcome, tuple[str, ...]]:
        v = classify_end(ended, spec, nodes, log, cancel_requested=False, hang_detected=False,
                         now=T0, settle_s=0, drained_working=drained, **kw)  # type: ignore[arg-type]
        return v.outcome, v.suspects

    dead = {"gpu01": NodeObservation("gpu01", "IDLE"),
            "gpu02": NodeObservation("gpu02", "DRAINED", reason, flags=("*",))}
    assert straggler_drained(ended.nodes, dead, "r-1") == set()
    assert verdict(straggler_drained(ended.nodes, dead, "r-1")) == (Outcome.INFRA, ("gpu02",))
    # Responding to Slurm, but dead for b300d's liveness checks, or lost while it ran.
    assert verdict({"gpu02"}, node_health={"gpu01": "alive", "gpu02": "dead"}) == (Outcome.INFRA, ("gpu02",))
    assert verdict({"gpu02"}, lost=["gpu02"]) == (Outcome.INFRA, ("gpu02",))
    assert verdict({"gpu02"}, node_health={"gpu01": "alive", "gpu02": "alive"}) == (Outcome.JOB_ERROR, ())


def test_config_keys() -> None:
    assert TrainingConfig().straggler_action == "alert"
    assert TrainingConfig().straggler_drain_every == 86400.0
    with pytest.raises(ConfigError, match="straggler_action"):
        load_training_config({"straggler_action": "cancel"})
    with pytest.raises(ConfigError, match="straggler_drain_every"):
        load_training_config({"straggler_drain_every": "soon"})


# -- the watch on the real cluster ------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


@pytest.fixture
def slurm(slurm_conf: str) -> Iterator[CliSlurmClient]:
    client = CliSlurmClient(slurm_conf=slurm_conf, timeout=30)
    yield client
    for n in client.nodes():
        if "DRAIN" in n.state.upper() and n.reason.startswith("b300: straggler"):
            client.resume_node(n.name)


def _attempt(store: SqlStore, tmp_path: Path, run: str, number_nodes: int = 2) -> Attempt:
    pattern = str(tmp_path / f"{run}.{{host}}.jsonl")
    spec = parse_spec(f'name = "s"\n[job]\ncommand = "true"\nnodes = {number_nodes}\n'
                      f'[health]\nprogress_file = {json.dumps(pattern)}\n')
    store.create_run(run, "s", dump_spec(spec), T0)
    a = store.begin_attempt(run, T0)
    store.confirm_attempt(a.id, 4242, T0)
    return store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=["gpu01", "gpu02"], start=T0)


def _slow(tmp_path: Path, run: str, slow: str, first: int, last: int) -> None:
    for host in ("gpu01", "gpu02"):
        with open(tmp_path / f"{run}.{host}.jsonl", "a") as f:
            for s in range(first, last + 1):
                f.write(json.dumps({"v": 1, "host": host, "step": s, "time": T0.timestamp() + s,
                                    "step_time_s": 1.0 if host == slow else 0.2}) + "\n")


def _watch(store: SqlStore, slurm: CliSlurmClient, clock: Clock, cfg: TrainingConfig,
           state_dir: Path | None = None) -> TrainingWatch:
    store.sync_nodes(slurm.nodes(), clock())  # what the cycle's observer does first
    return TrainingWatch(store, clock, lambda: cfg, state_dir=str(state_dir) if state_dir else None,
                         output_path=lambda a, s: None, drainer=StragglerDrainer(store, slurm, clock))


def _state(slurm: CliSlurmClient, node: str) -> NodeRecord:
    return next(n for n in slurm.nodes() if n.name == node)


@pytest.mark.slurm
def test_a_straggler_is_drained_once_under_the_policy(store: SqlStore, slurm: CliSlurmClient,
                                                      tmp_path: Path) -> None:
    attempt = _attempt(store, tmp_path, "r-1")
    clock = Clock()
    watch = _watch(store, slurm, clock, DRAIN)
    _slow(tmp_path, "r-1", "gpu02", 1, 20)
    clock.now = T0 + timedelta(seconds=21)
    assert watch.check([attempt]) == 1
    node = _state(slurm, "gpu02")
    assert "DRAIN" in node.state.upper()
    assert node.reason.startswith("b300: straggler in run r-1 job 4242: gpu02 took 1 s")
    drained = store.events(run_id="r-1", kinds=["node.drained"])
    assert [(e.node, e.attempt_id) for e in drained] == [("gpu02", attempt.id)]
    assert "5 steps in a row" in drained[0].data["straggler"]
    assert drained[0].data["step"] == 5
    assert [e.node for e in store.events(run_id="r-1", kinds=["training.straggler"])] == ["gpu02"]
    assert "DRAIN" not in _state(slurm, "gpu01").state.upper()
    # As the cycle records it: bad for Slurm, but not a failure of this run's attempt.
    store.sync_nodes(slurm.nodes(), clock())
    assert node_is_bad({n.name: n for n in store.list_nodes()}["gpu02"])
    seen = {n.name: n for n in slurm.nodes()}
    assert straggler_drained(["gpu01", "gpu02"], seen, "r-1") == {"gpu02"}
    assert straggler_drained(["gpu02"], seen, "r-2") == set()
    # gpu02 recovers, then gpu01 straggles within the window: alerted, not drained.
    _slow(tmp_path, "r-1", "gpu01", 21, 40)
    clock.now = T0 + timedelta(seconds=41)
    store.sync_nodes(slurm.nodes(), clock())
    assert watch.check([attempt]) == 1
    assert "DRAIN" not in _state(slurm, "gpu01").state.upper()
    kept = store.events(run_id="r-1", kinds=["training.straggler_kept"])
    assert [e.node for e in kept] == ["gpu01"] and "at most one per 6 h" in kept[0].data["why"]
    assert len(store.events(run_id="r-1", kinds=["node.drained"])) == 1


@pytest.mark.slurm
def test_a_drain_whose_record_was_lost_is_recorded_once(store: SqlStore, slurm: CliSlurmClient,
                                                        tmp_path: Path) -> None:
    """The daemon drained gpu02 and died before the write: the next one (no state file)
    finds the straggler again, sees the node drained with this run's straggler reason and
    records the drain (one event), instead of "drained already"."""
    attempt = _attempt(store, tmp_path, "r-1")
    slurm.drain_node("gpu02", straggler_reason("r-1", 4242, "gpu02 took 1 s (before the crash)"))
    clock = Clock()
    watch = _watch(store, slurm, clock, DRAIN, tmp_path / "state")
    _slow(tmp_path, "r-1", "gpu02", 1, 20)
    clock.now = T0 + timedelta(seconds=21)
    assert watch.check([attempt]) == 1
    assert [e.node for e in store.events(run_id="r-1", kinds=["node.drained"])] == ["gpu02"]
    assert store.events(run_id="r-1", kinds=["training.straggler_kept"]) == []
    watch.check([attempt])
    assert len(store.events(run_id="r-1", kinds=["node.drained"])) == 1


@pytest.mark.slurm
def test_the_default_and_a_run_that_would_not_fit_drain_nothing(store: SqlStore, slurm: CliSlurmClient,
                                                                tmp_path: Path) -> None:
    attempt = _attempt(store, tmp_path, "r-1")
    clock = Clock()
    watch = _watch(store, slurm, clock, TrainingConfig.model_validate({"straggler": {"steps": 5}}))
    _slow(tmp_path, "r-1", "gpu02", 1, 20)
    clock.now = T0 + timedelta(seconds=21)
    assert watch.check([attempt]) == 1
    assert store.events(run_id="r-1", kinds=["node.drained", "training.straggler_kept"]) == []
    assert "DRAIN" not in _state(slurm, "gpu02").state.upper()
    # A 4-node run on the 4-node partition: draining one would leave it 3.
    big = _attempt(store, tmp_path, "r-4", number_nodes=4)
    watch = _watch(store, slurm, clock, DRAIN)
    _slow(tmp_path, "r-4", "gpu02", 1, 20)
    assert watch.check([big]) == 1
    kept = store.events(run_id="r-4", kinds=["training.straggler_kept"])
    assert len(kept) == 1 and "the run needs 4" in kept[0].data["why"]
    assert "DRAIN" not in _state(slurm, "gpu02").state.upper()


@pytest.mark.slurm
def test_two_stragglers_in_one_poll_drain_one_node(store: SqlStore, slurm: CliSlurmClient,
                                                   tmp_path: Path) -> None:
    """Both found in the same evaluation: the first drain is not in the store yet (its
    event is written after the loop, the node records predate it); one drain per run."""
    pattern = str(tmp_path / "r-2.{host}.jsonl")
    spec = parse_spec(f'name = "s"\n[job]\ncommand = "true"\nnodes = 1\n'
                      f'[health]\nprogress_file = {json.dumps(pattern)}\n')
    store.create_run("r-2", "s", dump_spec(spec), T0)
    a = store.begin_attempt("r-2", T0)
    store.confirm_attempt(a.id, 4243, T0)
    hosts = ["gpu01", "gpu02", "gpu03", "gpu04"]
    attempt = store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=hosts, start=T0)
    for host in hosts:
        with open(tmp_path / f"r-2.{host}.jsonl", "a") as f:
            for s in range(1, 21):
                f.write(json.dumps({"v": 1, "host": host, "step": s, "time": T0.timestamp() + s,
                                    "step_time_s": 1.0 if host in ("gpu03", "gpu04") else 0.2}) + "\n")
    clock = Clock()
    watch = _watch(store, slurm, clock, DRAIN)
    clock.now = T0 + timedelta(seconds=21)
    assert watch.check([attempt]) == 2
    assert sorted(e.node or "" for e in store.events(run_id="r-2", kinds=["training.straggler"])) == \
        ["gpu03", "gpu04"]
    drained = store.events(run_id="r-2", kinds=["node.drained"])
    kept = store.events(run_id="r-2", kinds=["training.straggler_kept"])
    assert len(drained) == 1 and len(kept) == 1 and drained[0].node != kept[0].node
    assert "at most one per 6 h" in kept[0].data["why"]
    assert [n.name for n in slurm.nodes() if "DRAIN" in n.state.upper()] == [drained[0].node]


def test_a_drain_this_cycle_counts_in_the_fit_check(store: SqlStore) -> None:
    """Another run's drain this cycle leaves the partition a node short (the records predate it)."""
    assert "leave 1 usable node(s)" in (_refusal(drained_now=["gpu03"]) or "")
    assert "drained by b300d in this cycle" in (_refusal(drained_now=["gpu02"]) or "")


@pytest.mark.slurm
def test_recovery_asks_sinfo_about_a_straggler_drained_node(store: SqlStore, slurm: CliSlurmClient,
                                                            tmp_path: Path) -> None:
    """The recoverer's verdict on the real cluster: gpu02 drained as r-1's straggler and
    responding (sinfo ``drained``, no ``*``) is no suspect, so the job's error stays its own."""
    from b300.config import RecoveryConfig
    from b300.recovery.recoverer import Recoverer

    attempt = _attempt(store, tmp_path, "r-1")
    ended = store.update_attempt(attempt.id, T0, state=AttemptState.FAILED, exit_code=1, end=T0)
    slurm.drain_node("gpu02", straggler_reason("r-1", 4242, "slow"))
    # slurmctld may flag a node just resumed by an earlier test not responding (``*``) until
    # its next ping: wait for that (bounded), the case under test is a responding node.
    for _ in range(60):
        if "*" not in _state(slurm, "gpu02").flags:
            break
        time.sleep(1)
    assert "*" not in _state(slurm, "gpu02").flags
    store.sync_nodes(slurm.nodes(), T0)
    nodes_now = {n.name: n for n in store.list_nodes()}
    run = store.get_run("r-1")
    rec = Recoverer(store, slurm, None, lambda: T0, RecoveryConfig())  # type: ignore[arg-type]
    assert rec._straggler_drained(run, ended, nodes_now) == {"gpu02"}
    assert rec._straggler_drained(store.get_run("r-1"), ended, {}) == set()  # no sinfo call needed
    v = rec._verdict(run, ended, spec_of(run), nodes_now, T0)
    assert (v.outcome, v.suspects) == (Outcome.JOB_ERROR, ())  # a plain drain: INFRA, gpu02
