"""One table lists every timed job; registering one that is not in it is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from b300.drill.runner import _JOB_ID as DRILL_JOB
from b300.report.weekly import JOB_ID as REPORT_JOB
from b300.report.weekly import RETRY_JOB_ID as REPORT_RETRY_JOB
from b300.scheduling import table as timed

DAEMON = Path(__file__).resolve().parents[2] / "daemon"


def test_every_row_is_registered_and_every_registration_is_a_row() -> None:
    source = "\n".join(p.read_text() for p in DAEMON.rglob("*.py") if p.parent.name != "scheduling")
    assert "add_job(" not in source, "register timed jobs through b300.scheduling.table"
    literal = set(re.findall(r'timed\.(?:every|at|once)\([^,]+, "([^"]+)"', source))
    named = {DRILL_JOB, REPORT_JOB, REPORT_RETRY_JOB}
    assert literal | named == timed.IDS


def test_an_unknown_job_is_refused_and_a_known_one_runs_alone() -> None:
    sched = BackgroundScheduler()
    sched.start(paused=True)  # as in the daemon: registrations reach a running scheduler
    with pytest.raises(ValueError, match=r"not in b300\.scheduling\.table\.SCHEDULE"):
        timed.every(sched, "nightly-surprise", lambda: None, 60)
    timed.every(sched, "alerts", lambda: None, 60)
    timed.every(sched, "alerts", lambda: None, 30)  # a reload replaces it
    [job] = sched.get_jobs()
    assert job.id == "alerts" and job.max_instances == 1 and job.coalesce
    timed.drop(sched, "alerts")
    timed.drop(sched, "alerts")  # already gone: nothing to do
    assert sched.get_jobs() == []
    sched.shutdown(wait=False)
