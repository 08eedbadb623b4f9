"""The weekly report's spare capacity (issue 15): the idle GPU-hours the spares cost beside
the queue time they saved, from a week written through the real store. The expected
figures are worked out by hand from the timeline below, not by b300.report."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from report_history import W0, W1, spec

from b300.events import Kind
from b300.interfaces import NewEvent
from b300.model import AttemptState
from b300.report.collect import collect_report
from b300.report.compute import Window
from b300.report.render import render_text
from b300.store import open_store

H = timedelta(hours=1)
POOL = "b300-spares-batch"


def _pool(store, at, idle, **extra):  # type: ignore[no-untyped-def]
    store.append_events([NewEvent(Kind.SPARES_POOL, actor="spares", data={
        "partition": "batch", "reservation": POOL, "wanted": 2, "nodes": list(idle),
        "idle": list(idle), **extra})], at)


def _attempt(store, run_id, created, waited, ran, *, job, nodes, intent=None):  # type: ignore[no-untyped-def]
    events = [NewEvent(Kind.ATTEMPT_INTENT, run_id=run_id, data=intent)] if intent else []
    a = store.begin_attempt(run_id, created, events=events)
    store.confirm_attempt(a.id, job, created + timedelta(seconds=1))
    start = created + waited
    store.update_attempt(a.id, start, state=AttemptState.RUNNING, nodes=nodes, start=start)
    if ran is not None:
        store.update_attempt(a.id, start + ran, state=AttemptState.COMPLETED, end=start + ran)
    return a, start


def test_the_report_shows_what_the_spares_cost_beside_what_they_saved(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        # The pool held 2 idle nodes from a day before the window, 1 from W0+2d, and was
        # retired (a reload dropped it) at W0+5d: 2 x 48 h + 1 x 72 h = 168 idle node-hours,
        # x 8 GPUs (the runs of partition batch) = 1,344 GPU-hours.
        _pool(store, W0 - timedelta(days=1), ["gpu05", "gpu06"])
        _pool(store, W0 + timedelta(days=2), ["gpu06"])
        store.append_events([NewEvent(Kind.SPARES_POOL, actor="spares", data={
            "partition": "batch", "reservation": POOL, "wanted": 0, "nodes": [], "idle": [],
            "retired": True})], W0 + timedelta(days=5))
        part = 'partition = "batch"\n'
        # Run S: spare_nodes = 1 inside its allocation; waited 2 h in the plain queue, ran
        # 10 h; its step was relaunched on the spare 4 h in (spares_left 0): the spare sat
        # idle 4 h x 8 GPUs = 32 GPU-hours.
        s_spec = spec("s", 2).replace("nodes = 2\n", f"nodes = 2\n{part}spare_nodes = 1\n")
        store.create_run("run-s", "s", s_spec.replace("srun train", "python train.py"), W0 + H)
        a_s, s_start = _attempt(store, "run-s", W0 + H, 2 * H, 10 * H, job=11,
                                nodes=["gpu01", "gpu02", "gpu03"])
        store.append_events([NewEvent(Kind.ATTEMPT_STEP_RELAUNCH, run_id="run-s", attempt_id=a_s.id,
                                      actor="recovery", data={"job_id": 11, "generation": 1,
                                                              "exclude": ["gpu02"], "spares_left": 0})],
                            s_start + 4 * H)
        # Run P: waited 2 h in the plain queue; lost a node; its resubmission went into the
        # pool and started after 6 minutes: saved 2 h - 0.1 h = 1.9 h. The relaunch of S
        # saved the whole baseline (2 h, the median plain-queue wait): 3.9 h in all.
        store.create_run("run-p", "p", spec("p", 2).replace("nodes = 2\n", f"nodes = 2\n{part}"),
                         W0 + 20 * H)
        _attempt(store, "run-p", W0 + 20 * H, 2 * H, 5 * H, job=12, nodes=["gpu01", "gpu04"])
        _attempt(store, "run-p", W0 + 28 * H, timedelta(minutes=6), 5 * H, job=13,
                 nodes=["gpu05", "gpu06"], intent={"resubmit": True, "exclude": ["gpu04"],
                                                   "reservation": POOL})
        report = collect_report(store, Window(W0, W1), W1)
    finally:
        store.close()
    sp = report.spares
    assert sp is not None
    assert sp.pool_node_hours == {"batch": pytest.approx(168.0)}
    assert sp.pool_gpu_hours == pytest.approx(1344.0)
    assert sp.in_allocation_gpu_hours == pytest.approx(32.0)
    assert sp.cost_gpu_hours == pytest.approx(1376.0)
    assert (sp.pool_recoveries, sp.relaunches) == (1, 1)
    assert sp.baseline_queue_s == pytest.approx(2 * 3600)
    assert sp.saved_s == pytest.approx(3.9 * 3600)
    text = render_text(report)
    assert "Spares: 1376.0 idle GPU-hours, saved 3.9 h of queue wait" in text
    assert "Pool batch: 168.0 idle node-hours" in text


def test_no_spares_no_section_and_no_baseline_is_unknown(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        store.create_run("run-x", "x", spec("x", 1), W0 + H)
        _attempt(store, "run-x", W0 + H, H, H, job=21, nodes=["gpu01"])
        plain = collect_report(store, Window(W0, W1), W1)
        # A pool used by the one job there is: nothing waited in the plain queue to compare.
        only = open_store(f"sqlite:///{tmp_path}/only.db")
        try:
            _pool(only, W0 + 3 * H, ["gpu05"])
            only.create_run("run-y", "y", spec("y", 1), W0 + 3 * H)
            _attempt(only, "run-y", W0 + 3 * H, timedelta(minutes=1), H, job=22, nodes=["gpu05"],
                     intent={"resubmit": True, "exclude": [], "reservation": POOL})
            pooled = collect_report(only, Window(W0, W1), W1)
        finally:
            only.close()
    finally:
        store.close()
    assert plain.spares is None and "Spare capacity" not in render_text(plain)
    assert pooled.spares is not None and pooled.spares.saved_s is None
    assert any("time saved unknown" in n for n in pooled.spares.notes)
    assert "saved unknown h" in render_text(pooled)
