"""The weekly report's training section (issue 17), from a week written through the real
store: MFU and tokens/s (medians of the week's ``training.figures``), queue time per
attempt, recovery frequency, and the loss spikes and stragglers listed. Expected figures
are worked out by hand from the timeline below."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from b300.interfaces import NewEvent
from b300.model import AttemptState
from b300.report.collect import collect_report
from b300.report.compute import Window
from b300.report.render import render_html, render_text
from b300.store import SqlStore, open_store

W0 = datetime(2026, 11, 16, tzinfo=UTC)
W1 = W0 + timedelta(days=7)
SPEC = 'name = "t"\n[job]\ncommand = "srun train"\nnodes = 2\ngpus_per_node = 8\n'


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield s
    s.close()


def test_training_figures_per_run_and_the_weeks_findings(store: SqlStore) -> None:
    t0 = W0 + timedelta(days=1)
    store.create_run("t-1", "t", SPEC, t0)
    ids = []
    # Attempt 1 queued 30 min, ran 1 day, failed; attempt 2 queued 90 min, still running.
    timeline = ((t0, 30, t0 + timedelta(days=1)), (t0 + timedelta(days=1, minutes=5), 90, None))
    for created, queued, ended in timeline:
        a = store.begin_attempt("t-1", created)
        store.confirm_attempt(a.id, 100 + len(ids), created)
        start = created + timedelta(minutes=queued)
        store.update_attempt(a.id, start, state=AttemptState.RUNNING, nodes=["gpu01", "gpu02"], start=start)
        if ended is not None:
            store.update_attempt(a.id, ended, state=AttemptState.FAILED, end=ended, outcome="INFRA")
            store.append_events([NewEvent("recovery.resubmit", run_id="t-1", attempt_id=a.id,
                                          data={"outcome": "INFRA"})], ended + timedelta(minutes=1))
        ids.append(a.id)
    for i, (mfu, tps) in enumerate(((0.30, 1.0e6), (0.40, 1.2e6), (0.50, 1.4e6))):
        store.append_events([NewEvent("training.figures", run_id="t-1", attempt_id=ids[0],
                                      data={"step": 100 * (i + 1), "mfu": mfu, "tokens_per_s": tps})],
                            t0 + timedelta(hours=1 + i))
    store.append_events([NewEvent("training.loss_spike", run_id="t-1", attempt_id=ids[0],
                                  data={"evidence": "loss 9.1 at step 250 is above 3.2", "step": 250})],
                        t0 + timedelta(hours=2))
    store.append_events([NewEvent("training.straggler", run_id="t-1", attempt_id=ids[1], node="gpu02",
                                  data={"evidence": "gpu02 took 1.9 s for step 900", "host": "gpu02",
                                        "step": 900})], t0 + timedelta(days=2))
    # Before the window: not listed.
    store.append_events([NewEvent("training.loss_spike", run_id="t-1", data={"evidence": "old"})],
                        W0 - timedelta(days=1))

    report = collect_report(store, Window(W0, W1), W1)
    (t,) = report.training
    assert (t.run_id, t.mfu, t.tokens_per_s) == ("t-1", 0.40, 1.2e6)
    assert t.queue_s_per_attempt == pytest.approx((30 + 90) * 60 / 2)
    assert t.recoveries == 1
    wall_days = (W1 - t0).total_seconds() / 86400  # the run lives from t0 to the window's end
    assert t.recoveries_per_day == pytest.approx(1 / wall_days)
    assert [(f.kind, f.host, f.step) for f in report.training_findings] == [
        ("loss_spike", None, 250), ("straggler", "gpu02", 900)]
    text = render_text(report)
    assert "Training: MFU, tokens/s, queue time, recovery frequency" in text
    assert "40.0%" in text and "1,200,000" in text and "gpu02 took 1.9 s" in text
    assert "old" not in [f.evidence for f in report.training_findings]
    html = render_html(report, {}, lambda name, data: name)
    assert "Loss spikes and stragglers" in html and "loss 9.1 at step 250" in html
