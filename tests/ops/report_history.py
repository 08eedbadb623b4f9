"""A synthetic but realistic week of history, written through the real store API.

The expected figures are stated here by hand from the timeline (not computed by
b300.report), so the report's numbers are checked against an independent source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from b300.interfaces import NewEvent
from b300.model import AttemptState, CheckpointInfo, RunState
from b300.store import SqlStore

W0 = datetime(2026, 11, 16, tzinfo=UTC)  # a Monday
W1 = W0 + timedelta(days=7)
H = 3600.0
M = 60.0


def spec(name: str, nodes: int, gpus: int = 8, ckpt: str = "") -> str:
    text = f'name = "{name}"\n[job]\ncommand = "srun train"\nnodes = {nodes}\ngpus_per_node = {gpus}\n'
    return text + (f'[checkpoint]\ndir = "{ckpt}"\nlayout = "dcp"\ninterval = "1h"\n' if ckpt else "")


@dataclass(frozen=True)
class Expected:
    wall_h: dict[str, float]
    training_h: dict[str, float]
    detect_h: dict[str, float]
    queue_h: dict[str, float]
    restart_h: dict[str, float]
    recompute_h: dict[str, float | None]
    causes: dict[str, int]
    jobs: int
    gpu_hours: float
    drained: int
    returned: int
    ckpt_newest_step: int
    ckpt_age_h_at_w1: float
    ckpt_bytes: int
    ckpt_lag_h_at_w1: float


def _attempt(store: SqlStore, run_id: str, created: datetime, job_id: int, start: datetime,
             end: datetime | None, state: AttemptState, nodes: list[str], *, outcome: str = "",
             evidence: dict[str, object] | None = None, classified_after: timedelta | None = None,
             progress: list[tuple[timedelta, int]] = (), resume_from: str | None = None) -> None:
    a = store.begin_attempt(run_id, created, resume_from=resume_from)
    store.confirm_attempt(a.id, job_id, created + timedelta(seconds=1))
    store.update_attempt(a.id, start, state=AttemptState.RUNNING, nodes=nodes, start=start)
    for offset, step in progress:
        store.append_events([NewEvent("attempt.progress", run_id=run_id, attempt_id=a.id,
                                      data={"step": step})], start + offset)
    if end is None:
        return
    store.update_attempt(a.id, end, state=state, end=end)
    if outcome:
        at = end + (classified_after or timedelta())
        store.update_attempt(a.id, at, outcome=outcome, evidence=evidence or {}, events=[
            NewEvent("attempt.classified", run_id=run_id, attempt_id=a.id,
                     data={"outcome": outcome, **(evidence or {})})])


def build_history(store: SqlStore) -> Expected:
    # A run that ended before the window: must not appear.
    old = W0 - timedelta(days=3)
    store.create_run("old-run", "old", spec("old", 1), old)
    _attempt(store, "old-run", old, 900, old + timedelta(minutes=1), old + timedelta(hours=2),
             AttemptState.COMPLETED, ["gpu01"], outcome="COMPLETED")
    store.set_run_state("old-run", RunState.COMPLETED, old + timedelta(hours=2))

    # Run A: 2 nodes x 8 GPUs; a GPU Xid, then a node failure, then still running.
    a0 = W0 + timedelta(hours=1)
    store.create_run("run-a", "llama-a", spec("llama-a", 2, ckpt="/lustre/ckpt/llama-a"), a0)
    a1_start, a1_end = a0 + timedelta(minutes=30), W0 + timedelta(days=1)
    _attempt(store, "run-a", a0, 1001, a1_start, a1_end, AttemptState.FAILED, ["gpu01", "gpu02"],
             outcome="INFRA", evidence={"log": ["NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus"],
                                        "reasons": ["infrastructure errors in the job log"]},
             classified_after=timedelta(minutes=2),
             progress=[(timedelta(minutes=10), 1), (a1_end - a1_start - timedelta(minutes=5), 500)])
    a2_created = a1_end + timedelta(minutes=2)
    a2_start, a2_end = a2_created + timedelta(minutes=20), W0 + timedelta(days=3)
    _attempt(store, "run-a", a2_created, 1002, a2_start, a2_end, AttemptState.NODE_FAIL, ["gpu02", "gpu03"],
             outcome="INFRA", evidence={"reasons": ["node gpu02 is DOWN"], "suspects": ["gpu02"]},
             classified_after=timedelta(minutes=5), resume_from="/lustre/ckpt/llama-a/step400",
             progress=[(timedelta(minutes=15), 400), (timedelta(minutes=45), 500),
                       (timedelta(hours=5), 900)])
    store.append_events([NewEvent("node.drained", run_id="run-a", node="gpu02",
                                  data={"reason": "b300: run run-a job 1002 NODE_FAIL"})],
                        a2_end + timedelta(minutes=5))
    store.append_events([NewEvent("node.resumed", node="gpu02", actor="alice")], a2_end + timedelta(days=1))
    a3_created = a2_end + timedelta(minutes=5)
    a3_start = a3_created + timedelta(hours=1)
    # Both resume from checkpoints pruned since (their steps unknown to the report).
    _attempt(store, "run-a", a3_created, 1003, a3_start, None, AttemptState.RUNNING, ["gpu01", "gpu03"],
             resume_from="/lustre/ckpt/llama-a/step880",
             progress=[(timedelta(minutes=12), 880), (timedelta(minutes=20), 900), (timedelta(hours=2), 1200)])
    store.set_run_state("run-a", RunState.RUNNING, a3_start)
    # Its checkpoints: two replicated to s3, the newest not yet.
    ckpts = store.checkpoints
    listed = [CheckpointInfo(f"/lustre/ckpt/llama-a/step{n}", n, W1 - timedelta(hours=h), True, 40 * 10**9, 64)
              for n, h in ((900, 5), (1000, 3), (1100, 1.5))]
    ckpts.record_listing("run-a", listed, W1 - timedelta(hours=1))
    for info in listed[:2]:
        ckpts.record_replica("run-a", info.path, "s3", True, W1 - timedelta(hours=1))

    # Run B: 1 node; preempted, then the job's own error ends it.
    b0 = W0 + timedelta(days=2)
    store.create_run("run-b", "bert-b", spec("bert-b", 1), b0)
    b1_start, b1_end = b0 + timedelta(minutes=10), b0 + timedelta(hours=6)
    _attempt(store, "run-b", b0, 2001, b1_start, b1_end, AttemptState.PREEMPTED, ["gpu04"],
             outcome="PREEMPTED", classified_after=timedelta(minutes=1))
    b2_created = b1_end + timedelta(minutes=1)
    b2_start, b2_end = b2_created + timedelta(minutes=5), b1_end + timedelta(days=1)
    _attempt(store, "run-b", b2_created, 2002, b2_start, b2_end, AttemptState.FAILED, ["gpu04"],
             outcome="JOB_ERROR", evidence={"reasons": ["exit code 1"]}, classified_after=timedelta(minutes=1))
    b_done = b2_end + timedelta(minutes=1)
    store.set_run_state("run-b", RunState.FAILED, b_done)

    # Run C: 1 node; a hang, an NCCL connection loss, then completed.
    c0 = W0 + timedelta(days=4)
    store.create_run("run-c", "gpt-c", spec("gpt-c", 1, gpus=4), c0)
    c1_start, c1_end = c0 + timedelta(minutes=3), c0 + timedelta(hours=3)
    _attempt(store, "run-c", c0, 3001, c1_start, c1_end, AttemptState.CANCELLED, ["gpu03"],
             outcome="HANG", evidence={"reasons": ["cancelled by b300d: no progress"]},
             classified_after=timedelta(minutes=4))
    c2_created = c1_end + timedelta(minutes=4)
    c2_start, c2_end = c2_created + timedelta(minutes=6), c2_created + timedelta(hours=2)
    _attempt(store, "run-c", c2_created, 3002, c2_start, c2_end, AttemptState.FAILED, ["gpu01"],
             outcome="INFRA",
             evidence={"log": ["RuntimeError: [../third_party/gloo] Connection closed by peer"]},
             classified_after=timedelta(minutes=3))
    c3_created = c2_end + timedelta(minutes=3)
    c3_start, c3_end = c3_created + timedelta(minutes=2), c3_created + timedelta(hours=10)
    _attempt(store, "run-c", c3_created, 3003, c3_start, c3_end, AttemptState.COMPLETED, ["gpu01"],
             outcome="COMPLETED", classified_after=timedelta(seconds=30))
    store.set_run_state("run-c", RunState.COMPLETED, c3_end + timedelta(seconds=30))

    # Drift: one finding and a drain on gpu03, outside any run.
    store.append_events([NewEvent("drift.finding", node="gpu03",
                                  data={"probe": "nccl", "kind": "drift", "expected": "2.23.4",
                                        "found": "2.21.5", "policy": "drain"})], W0 + timedelta(days=5))
    store.append_events([NewEvent("drift.drained", node="gpu03", data={"reason": "b300: drift nccl"})],
                        W0 + timedelta(days=5, minutes=1))

    def h(td: timedelta) -> float:
        return td.total_seconds() / H

    # Expected figures, by hand from the timeline above.
    run_a_running = h(a1_end - a1_start) + h(a2_end - a2_start) + h(W1 - a3_start)
    run_a_restart = (10 + 15 + 12) / 60
    run_a_recompute = (30 + 8) / 60  # a2: step 400 -> 500 (a1's last); a3: 880 -> 900 (a2's last)
    run_b_running = h(b1_end - b1_start) + h(b2_end - b2_start)
    run_c_running = h(c1_end - c1_start) + h(c2_end - c2_start) + h(c3_end - c3_start)
    return Expected(
        wall_h={"run-a": h(W1 - a0), "run-b": h(b_done - b0), "run-c": h(c3_end + timedelta(seconds=30) - c0)},
        # training = running - restart - known recompute
        training_h={"run-a": run_a_running - run_a_restart - run_a_recompute, "run-b": run_b_running,
                    "run-c": run_c_running},
        detect_h={"run-a": (2 + 5) / 60, "run-b": (1 + 1) / 60, "run-c": (4 + 3) / 60},
        queue_h={"run-a": (30 + 20 + 60) / 60, "run-b": (10 + 5) / 60,
                 "run-c": (3 + 6 + 2) / 60},
        restart_h={"run-a": run_a_restart, "run-b": 0.0, "run-c": 0.0},
        recompute_h={"run-a": run_a_recompute, "run-b": None, "run-c": None},
        causes={"GPU": 1, "network": 1, "node down": 1, "hang": 1, "preemption": 1, "job error": 1,
                "checkpoint signal": 0, "other infrastructure": 0},
        jobs=8,
        gpu_hours=16 * run_a_running + 8 * run_b_running + 4 * run_c_running,
        drained=2, returned=1,
        ckpt_newest_step=1100, ckpt_age_h_at_w1=1.5, ckpt_bytes=120 * 10**9, ckpt_lag_h_at_w1=1.5,
    )
