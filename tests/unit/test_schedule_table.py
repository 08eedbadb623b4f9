"""One table lists every timed job; registering one that is not in it is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from b300.app.daemon import Daemon
from b300.app.root import build_daemon
from b300.config import load_config
from b300.drill.runner import _JOB_ID as DRILL_JOB
from b300.plugin_registry import PluginRegistry
from b300.scheduling import table as timed
from b300.slurm.cli import CliSlurmClient
from b300.store import open_store

DAEMON = Path(__file__).resolve().parents[2] / "daemon"


def test_only_the_table_puts_jobs_on_the_scheduler() -> None:
    source = "\n".join(p.read_text() for p in DAEMON.rglob("*.py") if p.parent.name != "scheduling")
    for call in ("add_job(", "reschedule_job(", "timed.at("):
        assert call not in source, f"{call} outside b300.scheduling: place timed jobs through its table"
    # Outside the start schedule only the drill (while open) and the SIGHUP reload are placed.
    direct = set(re.findall(r'timed\.(?:every|once)\([^,]+, "([^"]+)"', source)) | {DRILL_JOB}
    assert direct == {j.id for j in timed.SCHEDULE if j.placed != "start"}


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


def _daemon(tmp_path: Path, extra: str = "") -> Daemon:
    conf = tmp_path / "b300.toml"
    conf.write_text(f"[daemon]\nstate_dir = '{tmp_path}/state'\nsocket = '{tmp_path}/b300.sock'\n{extra}")
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    # Nothing here reaches Slurm: building the daemon and listing its schedule ask it nothing.
    slurm = CliSlurmClient(bin_dir=str(tmp_path / "no-slurm-here"))
    return build_daemon(load_config(str(conf)), store, slurm, plugins=PluginRegistry())


_ALWAYS = {"poll", "liveness", "checkpoints", "checkpoint-upkeep", "alerts"}
_REPORT = "[report]\nto = ['a@example.test']\nsmtp_host = '127.0.0.1'\n"


@pytest.mark.parametrize(("extra", "held"), [
    ("", _ALWAYS),                                                   # no [report] to, no [drift]
    (_REPORT, _ALWAYS | {"weekly-report", "weekly-report-catch-up"}),
    ("[liveness]\nenabled = false\n", _ALWAYS - {"liveness"}),
])
def test_after_start_the_scheduler_holds_the_tables_start_rows_that_are_on(
        tmp_path: Path, extra: str, held: set[str]) -> None:
    daemon = _daemon(tmp_path, extra)
    sched = daemon.parts.scheduler
    sched.start(paused=True)  # as serve() does it, with nothing run
    try:
        jobs = daemon.timed_jobs()
        assert set(jobs) == set(timed.AT_START)  # every start row named, on or off
        timed.start(sched, jobs)
        on_scheduler = {j.id: j for j in sched.get_jobs()}
        assert set(on_scheduler) == held
        cfg = daemon.parts.config
        assert on_scheduler["poll"].trigger.interval.total_seconds() == cfg.poll_interval_s
        assert on_scheduler["alerts"].trigger.interval.total_seconds() == cfg.alerts.scan_interval_s
        assert all(j.max_instances == 1 and j.coalesce for j in on_scheduler.values())
    finally:
        sched.shutdown(wait=False)
        daemon.parts.store.close()


def test_a_start_schedule_missing_a_row_is_refused() -> None:
    sched = BackgroundScheduler()
    with pytest.raises(ValueError, match=r"missing \['poll'"):
        timed.start(sched, {i: None for i in timed.AT_START if i != "poll"})
    with pytest.raises(ValueError, match="not start rows"):
        timed.start(sched, {**dict.fromkeys(timed.AT_START), "drill": None})
