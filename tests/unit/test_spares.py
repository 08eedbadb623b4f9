"""In-allocation restart (spare_nodes): the plan file and its generation rules, the
launcher's decisions, the spec key, the batch script, and the daemon's relaunch decision
on a real (SQLite) store with real checkpoint folders."""

from __future__ import annotations

import json
import os
import shlex
from datetime import UTC, datetime
from pathlib import Path

import pytest

from b300.errors import SpecError
from b300.events import Kind
from b300.interfaces import Store
from b300.launcher import launch as lf
from b300.model import Attempt, AttemptState
from b300.recovery.classify import retries_used
from b300.recovery.relaunch import Relaunch, StepRelauncher, relaunches
from b300.slurm.script import build_request, launch_dir
from b300.spec import dump_spec, parse_spec
from b300.store import open_store

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# -- the plan file ------------------------------------------------------------------


def test_a_plan_is_written_atomically_and_only_forwards(tmp_path: Path) -> None:
    assert lf.read_plan(tmp_path, 7) is None   # generation 0: no file
    p1 = lf.next_plan(None, 7, ["gpu02"], "/ck/step_10", "node lost")
    assert (p1.generation, p1.exclude) == (1, ("gpu02",))
    lf.write_plan(tmp_path, p1)
    assert lf.read_plan(tmp_path, 7) == p1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # The same generation again, or an older one, is refused: a stale writer never steps back.
    for stale in (p1, lf.Plan(7, 0, (), "")):
        with pytest.raises(lf.StalePlan, match="generation 1 is on disk"):
            lf.write_plan(tmp_path, stale)
    p2 = lf.next_plan(lf.read_plan(tmp_path, 7), 7, ["gpu03"], "/ck/step_20", "node lost")
    assert (p2.generation, p2.exclude) == (2, ("gpu02", "gpu03"))
    lf.write_plan(tmp_path, p2)
    assert lf.read_plan(tmp_path, 7) == p2
    # A generation recorded as intended (and not yet on disk) is skipped over, never reused.
    assert lf.next_plan(p2, 7, ["gpu04"], "", "", at_least=5).generation == 6


def test_another_jobs_plan_is_not_this_jobs(tmp_path: Path) -> None:
    lf.write_plan(tmp_path, lf.Plan(7, 3, ("gpu02",), "/ck"))
    assert lf.read_plan(tmp_path, 8) is None
    # A new job in the same folder starts over at generation 1, with no exclusions.
    assert lf.next_plan(lf.read_plan(tmp_path, 8), 8, ["gpu05"], "", "") == lf.Plan(8, 1, ("gpu05",), "")
    lf.write_plan(tmp_path, lf.Plan(8, 1, ("gpu05",), ""))
    assert lf.read_plan(tmp_path, 8) == lf.Plan(8, 1, ("gpu05",), "")


@pytest.mark.parametrize(("text", "problem"), [
    ("[1, 2]", "not a JSON object"),
    ("{not json", "not JSON"),
    ('{"job_id": 0, "generation": 1}', "job_id must be a positive integer"),
    ('{"job_id": 7, "generation": -1}', "generation must be an integer"),
    ('{"job_id": 7, "generation": true}', "generation must be an integer"),
    ('{"job_id": 7, "generation": 1, "exclude": "gpu01"}', "exclude must be a list of node names"),
    ('{"job_id": 7, "generation": 1, "exclude": ["a,b"]}', "exclude must be a list of node names"),
    ('{"job_id": 7, "generation": 1, "resume_from": 3}', "resume_from and reason must be strings"),
])
def test_a_bad_plan_is_one_line_naming_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / lf.PLAN).write_text(text)
    with pytest.raises(lf.PlanError, match=problem) as err:
        lf.read_plan(tmp_path, 7)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_status_round_trips_and_names_its_job(tmp_path: Path) -> None:
    status = lf.Status(7, 2, "running", step_id="7.2", nodes="gpu[01,03]", started_at=5.0)
    lf.write_status(tmp_path, status)
    assert lf.read_status(tmp_path, 7) == status
    assert lf.read_status(tmp_path, 9) is None
    (tmp_path / lf.STATUS).write_text('{"job_id": 7}')
    with pytest.raises(lf.PlanError, match="not a launcher status"):
        lf.read_status(tmp_path, 7)


# -- the launcher's decisions -------------------------------------------------------


@pytest.mark.parametrize(("running", "rc", "newest", "ended_for", "action"), [
    (0, None, 0, 0.0, lf.Action.WAIT),     # the step runs, nothing planned
    (0, None, 1, 0.0, lf.Action.STOP),     # a newer plan: end the step first
    (1, None, 1, 0.0, lf.Action.WAIT),     # the plan it runs is not newer than itself
    (0, 0, 1, 0.0, lf.Action.EXIT),        # the training finished: nothing to relaunch
    (0, 0, 0, 0.0, lf.Action.EXIT),
    (0, 1, 1, 0.0, lf.Action.START),       # failed (its peer died) and the plan is there
    (0, 1, 0, 5.0, lf.Action.WAIT),        # failed: hold for the daemon's plan
    (0, 1, 0, 60.0, lf.Action.EXIT),       # no plan within the hold: the job ends, as today
    (2, 137, 2, 61.0, lf.Action.EXIT),
])
def test_launcher_decisions(running: int, rc: int | None, newest: int, ended_for: float,
                            action: lf.Action) -> None:
    assert lf.decide(running, rc, newest, ended_for, hold_s=60.0) is action


def test_a_stale_step_is_one_only_a_dead_excluded_node_holds() -> None:
    assert lf.stale_step(["gpu01", "gpu02"], ["gpu02"], srun_returned=True)
    # srun killed by the launcher proves nothing about the step's tasks.
    assert not lf.stale_step(["gpu01", "gpu02"], ["gpu02"], srun_returned=False)
    # A step on healthy nodes only is a live step, whatever srun did.
    assert not lf.stale_step(["gpu01", "gpu03"], ["gpu02"], srun_returned=True)
    assert not lf.stale_step([], ["gpu02"], srun_returned=True)


def test_step_argv_and_squeue_steps() -> None:
    plan = lf.Plan(7, 2, ("gpu02", "gpu05"), "/ck/step 10")
    argv = lf.step_argv(plan, nodes=2, tasks_per_node=4, command="python t.py --resume {resume_from}")
    assert argv[:6] == ["srun", "--job-name=b300-step", "--nodes=2", "--ntasks=8",
                        "--ntasks-per-node=4", "--kill-on-bad-exit=1"]
    assert "--exclude=gpu02,gpu05" in argv and "--overlap" not in argv
    assert argv[-3:] == ["bash", "-c", "python t.py --resume '/ck/step 10'"]
    assert "--overlap" in lf.step_argv(plan, nodes=2, tasks_per_node=1, command="x", overlap=True)
    assert "--exclude" not in " ".join(lf.step_argv(lf.Plan(7, 0), nodes=1, tasks_per_node=1,
                                                    command="x"))
    out = "7.0|b300-step|gpu[01-02]\n7.batch|batch|gpu01\n7.1|other|gpu03\n71.0|b300-step|gpu04\n"
    assert lf.parse_steps(out, 7) == [("7.0", "gpu[01-02]")]


def test_launcher_refuses_bad_arguments_in_one_line(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert lf.main(["--dir", str(tmp_path), "--nodes", "2", "--command", "x"]) == 2
    assert capsys.readouterr().err.strip() == ("b300.launcher: SLURM_JOB_ID is not set: run me "
                                               "as a Slurm batch script")
    assert lf.main(["--dir", str(tmp_path), "--nodes", "0", "--command", "x"]) == 2
    assert "at least 1" in capsys.readouterr().err


# -- the spec and the batch script --------------------------------------------------


def _spec_text(command: str = "python train.py", extra: str = "spare_nodes = 1\n",
               ckpt: str = "/ck") -> str:
    return (f'name = "s"\n[job]\ncommand = {json.dumps(command)}\nnodes = 2\n{extra}'
            f'ntasks_per_node = 1\n[checkpoint]\ndir = "{ckpt}"\nlayout = "dcp"\n[retries]\ninfra = 2\n')


def test_spare_nodes_spec_key() -> None:
    spec = parse_spec(_spec_text())
    assert spec.spare_nodes == 1 and parse_spec(dump_spec(spec)) == spec
    assert parse_spec(_spec_text(extra="")).spare_nodes == 0
    for bad, problem in (("spare_nodes = -1\n", "spare_nodes must be >= 0"),
                         ("spare_nodes = 1.5\n", "spare_nodes must be an integer"),
                         ('spare_nodes = "1"\n', "spare_nodes must be an integer")):
        with pytest.raises(SpecError, match=problem) as err:
            parse_spec(_spec_text(extra=bad))
        assert "\n" not in str(err.value)
    for command in ("srun python train.py", "cd /x\n/usr/bin/srun python t.py"):
        with pytest.raises(SpecError, match="with spare_nodes it is what each task runs"):
            parse_spec(_spec_text(command))
    # Without spares, srun in the command is the job's own business, as before.
    assert parse_spec(_spec_text("srun python t.py", extra="")).command == "srun python t.py"


def test_a_spare_run_asks_for_nodes_plus_spares_and_runs_the_launcher() -> None:
    spec = parse_spec(_spec_text("python t.py --resume {resume_from}"))
    req = build_request(spec, run_id="r1", attempt=3, resume_from="/ck/step_5", log_dir="/logs")
    assert (req.nodes, req.no_kill) == (3, True)
    last = req.script.rstrip().splitlines()[-1]
    argv = shlex.split(last)
    assert argv[0] == "exec" and argv[2:4] == ["-m", "b300.launcher"]
    assert argv[argv.index("--dir") + 1] == launch_dir("/logs", "r1", 3) == "/logs/launch/b300-r1-a3"
    assert argv[argv.index("--nodes") + 1] == "2"
    # The launcher puts each generation's checkpoint in: the placeholder stays in its argv.
    assert argv[argv.index("--command") + 1] == "python t.py --resume {resume_from}"
    assert "export B300_RESUME_FROM=/ck/step_5" in req.script
    plain = build_request(parse_spec(_spec_text(extra="")), run_id="r1", attempt=1, log_dir="/logs")
    assert (plain.nodes, plain.no_kill) == (2, False) and "b300.launcher" not in plain.script


def test_pyslurm_backend_asks_for_no_kill_too() -> None:
    from b300.slurm.pyslurm_backend import submit_description

    spec = parse_spec(_spec_text())
    req = build_request(spec, run_id="r1", attempt=1, log_dir="/logs")
    assert submit_description(req, {})["kill_on_node_fail"] is False
    plain = build_request(parse_spec(_spec_text(extra="")), run_id="r1", attempt=1, log_dir="/logs")
    assert "kill_on_node_fail" not in submit_description(plain, {})


# -- the daemon's decision ----------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = open_store(f"sqlite:///{tmp_path}/state.db")
    yield s  # type: ignore[misc]
    s.close()


def _ckpt(root: Path, step: int) -> None:
    """A real torch DCP checkpoint (one process)."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dist_cp

    dist_cp.save({"step": torch.tensor(step)}, checkpoint_id=str(root / f"step_{step:06d}"),
                 no_dist=True)


def _running(store: Store, tmp_path: Path, nodes: list[str], *, extra: str = "spare_nodes = 1\n",
             run_id: str = "r1") -> Attempt:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    store.create_run(run_id, "s", _spec_text(extra=extra, ckpt=str(ckpt)), T0)
    a = store.begin_attempt(run_id, T0)
    store.confirm_attempt(a.id, 40, T0)
    return store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=nodes)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_relaunch_plans_the_next_generation_from_the_newest_checkpoint(
        store: Store, tmp_path: Path) -> None:
    _ckpt(tmp_path / "ckpt", 5)
    _ckpt(tmp_path / "ckpt", 10)
    attempt = _running(store, tmp_path, ["gpu01", "gpu02", "gpu03"])
    r = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    decision, why = r.on_dead(attempt, "gpu02", T0)
    assert decision is Relaunch.RELAUNCHED, why
    plan = lf.read_plan(r.folder(attempt), 40)
    assert plan == lf.Plan(40, 1, ("gpu02",), str(tmp_path / "ckpt" / "step_000010"),
                           "node lost: ['gpu02']")
    [ev] = relaunches(store, "r1")
    assert ev.data["resume_from"] == plan.resume_from and ev.data["spares_left"] == 0
    assert [e.node for e in store.events(run_id="r1", kinds=[Kind.NODE_FAILED])] == ["gpu02"]
    # The same node again (a second round, or after a restart): nothing more.
    assert r.on_dead(attempt, "gpu02", T0)[0] is Relaunch.ALREADY
    assert len(relaunches(store, "r1")) == 1
    # Slurm took gpu02 out of the job; now gpu03 dies too: no spare is left.
    attempt = store.update_attempt(attempt.id, T0, nodes=["gpu01", "gpu03"])
    decision, why = r.on_dead(attempt, "gpu03", T0)
    assert decision is Relaunch.NO_SPARE and "1 healthy node(s) left" in why
    assert lf.read_plan(r.folder(attempt), 40) == plan


def test_an_idle_spare_that_dies_is_not_a_relaunch(store: Store, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path, ["gpu01", "gpu02", "gpu03"])
    r = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    os.makedirs(r.folder(attempt))
    lf.write_status(r.folder(attempt), lf.Status(40, 0, "running", "40.0", "gpu[01-02]"))
    assert r.on_dead(attempt, "gpu03", T0)[0] is Relaunch.NOT_IN_STEP
    assert r.on_dead(attempt, "gpu02", T0)[0] is Relaunch.RELAUNCHED


def test_the_batch_hosts_loss_is_not_a_relaunch(store: Store, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path, ["gpu01", "gpu02", "gpu03"])
    r = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    decision, why = r.on_dead(attempt, "gpu01", T0)   # no status yet: the first node
    assert decision is Relaunch.NO_SPARE and "batch host" in why
    os.makedirs(r.folder(attempt))
    lf.write_status(r.folder(attempt), lf.Status(40, 0, "running", "40.0", "gpu[02-03]",
                                                 batch_host="gpu02"))
    assert r.on_dead(attempt, "gpu02", T0)[0] is Relaunch.NO_SPARE
    assert r.on_dead(attempt, "gpu01", T0)[0] is Relaunch.NOT_IN_STEP
    assert not relaunches(store, "r1")


def test_relaunches_spend_the_infra_budget(store: Store, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path, [f"gpu0{i}" for i in range(1, 7)],
                       extra="spare_nodes = 4\n")   # plenty of spares, infra = 2
    r = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    assert r.on_dead(attempt, "gpu02", T0)[0] is Relaunch.RELAUNCHED
    assert r.on_dead(attempt, "gpu03", T0)[0] is Relaunch.RELAUNCHED
    decision, why = r.on_dead(attempt, "gpu04", T0)
    assert decision is Relaunch.NO_SPARE and "retry budget spent (2)" in why
    assert lf.read_plan(r.folder(attempt), 40).generation == 2  # type: ignore[union-attr]
    assert retries_used(store.attempts("r1")) == (0, 0) and len(relaunches(store, "r1")) == 2
    from b300.ops.health import CycleSnapshot
    from b300.ops.metrics import collect_metrics

    m = collect_metrics(store, CycleSnapshot(1, 0, 0.1, 0.0, None, 0), T0)
    assert (m.step_relaunches_total, m.recoveries_total) == (2, 0)


def test_a_run_without_spares_takes_todays_path(store: Store, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path, ["gpu01", "gpu02"], extra="")
    r = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    assert r.on_dead(attempt, "gpu02", T0)[0] is Relaunch.NOT_SPARE
    assert not os.path.exists(r.folder(attempt))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_reconcile_writes_a_recorded_plan_and_records_the_started_step(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon killed between the intent and the plan: the next one writes the plan from
    the record; the launcher's status then gives one attempt.step_started."""
    _ckpt(tmp_path / "ckpt", 10)
    attempt = _running(store, tmp_path, ["gpu01", "gpu02", "gpu03"])
    r = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    folder = r.folder(attempt)
    assert r.on_dead(attempt, "gpu02", T0)[0] is Relaunch.RELAUNCHED
    # What a SIGKILL right after the intent (crashpoint relaunch_recorded) leaves on disk:
    os.unlink(os.path.join(folder, lf.PLAN))
    r2 = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    r2.reconcile(T0)
    plan = lf.read_plan(folder, 40)
    assert plan is not None and plan.generation == 1 and plan.exclude == ("gpu02",)
    assert not store.events(run_id="r1", kinds=[Kind.ATTEMPT_STEP_STARTED])
    lf.write_status(folder, lf.Status(40, 1, "running", "40.1", "gpu[01,03]"))
    r2.reconcile(T0)
    r2.reconcile(T0)
    [started] = store.events(run_id="r1", kinds=[Kind.ATTEMPT_STEP_STARTED])
    assert started.data["nodes"] == ["gpu01", "gpu03"] and started.data["step_id"] == "40.1"


def test_a_node_drained_for_drift_under_the_step_is_relaunched_off(
        store: Store, tmp_path: Path) -> None:
    attempt = _running(store, tmp_path, ["gpu01", "gpu02", "gpu03", "gpu04"],
                       extra="spare_nodes = 2\n")
    r = StepRelauncher(store, lambda: T0, log_dir=str(tmp_path / "logs"))
    folder = r.folder(attempt)
    os.makedirs(folder)
    lf.write_status(folder, lf.Status(40, 0, "running", "40.0", "gpu[01-02]", batch_host="gpu01"))
    store.drift.mark_drained("gpu04", "b300 drift: nccl", T0)   # an idle spare: nothing to move
    r.reconcile(T0)
    assert lf.read_plan(folder, 40) is None
    store.drift.mark_drained("gpu02", "b300 drift: nccl", T0)
    r.reconcile(T0)
    r.reconcile(T0)   # a second round: still the one relaunch
    plan = lf.read_plan(folder, 40)
    # Neither drifted node is a place for the new step.
    assert plan is not None and (plan.generation, plan.exclude) == (1, ("gpu02", "gpu04"))
    [ev] = relaunches(store, "r1")
    assert ev.data["cause"] == "drift" and ev.data["spares_left"] == 0
    assert not store.events(run_id="r1", kinds=[Kind.NODE_FAILED])   # drift is no strike
    # The new step runs on gpu01 and gpu03; gpu03 drifts too: no spare left, the step stays.
    lf.write_status(folder, lf.Status(40, 1, "running", "40.1", "gpu[01,03]", batch_host="gpu01"))
    store.drift.mark_drained("gpu03", "b300 drift: nccl", T0)
    r.reconcile(T0)
    r.reconcile(T0)
    assert lf.read_plan(folder, 40) == plan and len(relaunches(store, "r1")) == 1
    assert (attempt.id, "gpu03", 1) in r._drift_seen   # decided once, not every round
