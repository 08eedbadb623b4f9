"""The schedule and its Young/Daly advice as the store gives them to `b300ctl status`, the
weekly report and the metrics (SQLite and PostgreSQL), with the inputs it used."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

from b300.checkpoints.advice import stored_run_schedule
from b300.model import AttemptState, CheckpointInfo, RunState
from b300.ops.health import CycleSnapshot
from b300.ops.metrics import collect_metrics, render_metrics
from b300.report.collect import collect_report
from b300.report.compute import Window
from b300.report.render import render_text
from b300.spec import parse_spec
from b300.store import SqlStore
from store_fixtures import pg_database_fixture, store_fixture, store_url_fixture  # noqa: F401

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
SPEC = ('name = "yd"\n[job]\ncommand = "true"\nnodes = 2\ngpus_per_node = 0\n'
        '[checkpoint]\ndir = "/ckpt/yd"\nlayout = "dcp"\ninterval = "30m"\nsignal = "USR1"\n')
TWO = ("gpu01", "gpu02")


def _running_run(store: SqlStore, run_id: str, started: datetime, *, failed_before: bool) -> None:
    store.create_run(run_id, run_id, SPEC, started - timedelta(hours=8))
    if failed_before:  # 6 h on two nodes, then a node failure
        a = store.begin_attempt(run_id, started - timedelta(hours=6))
        store.confirm_attempt(a.id, 100, started - timedelta(hours=6))
        store.update_attempt(a.id, started, state=AttemptState.NODE_FAIL, nodes=TWO,
                             start=started - timedelta(hours=6), end=started, outcome="INFRA")
    b = store.begin_attempt(run_id, started)
    store.confirm_attempt(b.id, 101, started)
    store.update_attempt(b.id, started, state=AttemptState.RUNNING, nodes=TWO, start=started)
    store.set_run_state(run_id, RunState.RUNNING, started)


def _metric(text: str, name: str, run: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'{name}{{run="{run}"}} '):
            return float(line.split()[-1])
    return None


def test_young_daly_beside_the_interval_in_status_report_and_metrics(store: SqlStore) -> None:
    started = NOW - timedelta(hours=2)
    _running_run(store, "yd-run", started, failed_before=True)
    store.checkpoints.record_listing("yd-run", [
        CheckpointInfo(f"/ckpt/yd/step_{s}", s, started + timedelta(minutes=20 * s), True, 10, 3, save_s=save)
        for s, save in ((1, 40.0), (2, 50.0), (3, 45.0))], NOW)
    spec = parse_spec(SPEC)
    sched = stored_run_schedule(store, store.get_run("yd-run"), spec, NOW)
    assert sched is not None
    # 6 h + 2 h on 2 nodes = 16 node-hours, one failure: 8 h MTBF for the run's 2 nodes; save 45 s.
    expected = math.sqrt(2 * 45.0 * 8 * 3600)
    yd = sched.to_dict()["young_daly"]
    assert yd["interval_s"] == round(expected, 1) and yd["save_s"] == 45.0 and yd["save_samples"] == 3
    assert (yd["cluster_failures"], yd["cluster_node_hours"], yd["run_failures"]) == (1, 16.0, 1)
    assert sched.overdue and sched.counted_from == "checkpoint" and sched.age_s == 60 * 60
    text = sched.lines()
    assert text[0] == ("schedule: every 30.0 min; newest checkpoint (step 3) 60.0 min old; OVERDUE; "
                       "signal when late: USR1 to the batch shell")
    assert text[1].startswith(f"Young/Daly {expected / 60:.1f} min vs configured 30.0 min; save 45.0 s")

    metrics = render_metrics(collect_metrics(store, CycleSnapshot(0, 0, None, None, None), NOW))
    assert _metric(metrics, "b300_checkpoint_young_daly_seconds", "yd-run") == round(expected, 3)
    assert _metric(metrics, "b300_checkpoint_interval_seconds", "yd-run") == 1800
    assert _metric(metrics, "b300_checkpoint_save_seconds", "yd-run") == 45
    assert _metric(metrics, "b300_checkpoint_mtbf_seconds", "yd-run") == 8 * 3600
    assert _metric(metrics, "b300_checkpoint_overdue", "yd-run") == 1

    report = collect_report(store, Window(NOW - timedelta(days=7), NOW), NOW)
    (fig,) = report.checkpoints or ()
    assert fig.young_daly_s == expected and fig.save_s == 45.0 and fig.mtbf_s == 8 * 3600
    rendered = render_text(report)
    assert f"{expected / 3600:.1f}" in rendered and f"yd-run: Young/Daly {expected / 60:.1f} min" in rendered
    assert json.dumps(sched.to_dict())  # what `b300ctl status RUN --json` prints under checkpoint_schedule


def test_a_running_run_without_a_checkpoint_has_its_age_metric(store: SqlStore) -> None:
    _running_run(store, "fresh", NOW - timedelta(minutes=45), failed_before=False)
    metrics = render_metrics(collect_metrics(store, CycleSnapshot(0, 0, None, None, None), NOW))
    assert _metric(metrics, "b300_checkpoint_newest_age_seconds", "fresh") == 45 * 60
    assert _metric(metrics, "b300_checkpoint_overdue", "fresh") == 1
    assert _metric(metrics, "b300_checkpoint_young_daly_seconds", "fresh") is None  # no inputs yet
    sched = stored_run_schedule(store, store.get_run("fresh"), parse_spec(SPEC), NOW)
    assert sched is not None and sched.counted_from == "start"
    assert "no checkpoint yet in this attempt, 45.0 min since it started; OVERDUE" in sched.lines()[0]
    assert "Young/Daly: no advice yet (no checkpoint save time measured; no infrastructure failure" \
        in sched.lines()[1]
