"""The checkpoint schedule end to end: a real b300d, the real Slurm cluster, and batch scripts
the project did not write (plain bash, as a user's would be).

Four runs side by side, interval 10 s, checked every second:

- **plain**: no opt-in, no trap (the spec shape of docs/job-specs.md). It must not be signalled, so it
  keeps running; one overdue alert, no signal event.
- **trapper**: opts in and checkpoints from its USR1 trap. Each time it is late it gets
  USR1, writes a checkpoint that the daemon verifies, and nobody is paged.
- **slipper**: opts in, traps USR1 but never checkpoints. One alert, one event per signal,
  never two signals within an interval; once cancelled, nothing more about it.
- **careless**: opts in but does not trap. USR1 ends its batch shell: the attempt is
  SIGNALLED (the daemon's doing, not JOB_ERROR), the run is resubmitted, and the new
  attempt is not signalled again.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from helpers import DaemonHandle, make_daemon, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
INTERVAL_S = 10.0

_SAVE = ('save() { n=$((n+1)); d="$CKPT/step_$n"; mkdir -p "$d"; head -c 65536 /dev/urandom > "$d/model.pt"; '
         'sleep 1; echo ok > "$d/DONE"; echo "saved $n" >> "$LOG"; }\n')
SCRIPTS = {
    "plain": "while true; do sleep 1; done\n",
    "trapper": "n=0\n" + _SAVE + "trap save USR1\nwhile true; do sleep 1; done\n",
    "slipper": "n=0\n" + _SAVE + "save\ntrap 'echo got USR1 >> \"$LOG\"' USR1\nwhile true; do sleep 1; done\n",
    "careless": "while true; do sleep 1; done\n",
}
OPT_IN = {"trapper", "slipper", "careless"}


def _spec(tmp_path: Path, name: str) -> Path:
    ckpt = tmp_path / name / "ckpt"
    ckpt.mkdir(parents=True)
    log = tmp_path / name / "log.txt"
    body = f"CKPT={json.dumps(str(ckpt))}\nLOG={json.dumps(str(log))}\n" + SCRIPTS[name]
    lines = [f'name = "{name}"', "[job]", f"command = {json.dumps(body)}", "nodes = 1", "gpus_per_node = 0",
             'time_limit = "00:10:00"', "[checkpoint]", f"dir = {json.dumps(str(ckpt))}", 'layout = "generic"',
             f'interval = "{INTERVAL_S:g}s"']
    if name in OPT_IN:
        lines.append('signal = "USR1"')
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _events(d: DaemonHandle, run_id: str, prefix: str = "checkpoint.") -> list[dict[str, Any]]:
    return [e for e in d.run(run_id)["events"] if e["kind"].startswith(prefix)]


def _kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def _log(tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / name / "log.txt"
    return path.read_text().splitlines() if path.exists() else []


def _job_state(d: DaemonHandle, job_id: int) -> str:
    return slurm_cmd(d.slurm_conf, "squeue", "-h", "-j", str(job_id), "-o", "%T").strip()


@pytest.fixture
def daemon(tmp_path: Path, slurm_conf: str) -> Any:
    d = make_daemon(tmp_path, slurm_conf, poll_interval="0.5s")
    d.config.write_text(d.config.read_text() + '[checkpoints]\ncheck_interval = "1s"\nsignal_grace = "6s"\n'
                        'manifests_per_pass = 10\n')
    d.start()
    try:
        yield d
    finally:
        d.cleanup()


def test_schedule_signals_only_opted_in_jobs_and_never_kills_a_run(daemon: DaemonHandle,
                                                                   tmp_path: Path) -> None:
    d = daemon
    runs = {name: d.submit(_spec(tmp_path, name)) for name in SCRIPTS}
    for name in SCRIPTS:
        d.wait_run(runs[name], {"RUNNING"}, timeout=60)

    # slipper: one alert after the grace, then one signal event per interval, each one received.
    wait_for(lambda: len(_kinds(_events(d, runs["slipper"]), "checkpoint.signal")) >= 3, 90,
             "three signals to the slipping job")
    slip = _events(d, runs["slipper"])
    signals = _kinds(slip, "checkpoint.signal")
    times = [datetime.fromisoformat(e["ts"]) for e in signals]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert all(g >= INTERVAL_S for g in gaps), gaps
    assert [e["data"]["number"] for e in signals] == list(range(1, len(signals) + 1))
    (alert,) = _kinds(slip, "checkpoint.overdue")
    assert alert["data"]["signals"] >= 1 and "after 1 signal(s)" in alert["data"]["message"]
    assert "newest complete checkpoint (step 1) is" in alert["data"]["message"]
    assert not _kinds(slip, "checkpoint.ok")
    wait_for(lambda: _log(tmp_path, "slipper").count("got USR1") >= len(signals), 30,
             "the job to get each USR1")

    # plain: overdue and alerted once, never signalled, still running as the same job.
    plain = _events(d, runs["plain"])
    (alert,) = _kinds(plain, "checkpoint.overdue")
    assert "no checkpoint yet" in alert["data"]["message"] and "not signalled: the spec does not opt in" \
        in alert["data"]["message"]
    assert not _kinds(plain, "checkpoint.signal")
    status = d.run(runs["plain"])
    assert status["run"]["state"] == "RUNNING" and len(status["attempts"]) == 1
    assert _job_state(d, status["attempts"][0]["job_id"]) == "RUNNING"

    # trapper: signalled when late, checkpoints from the trap, verified, and nobody paged.
    trap = _events(d, runs["trapper"])
    assert _kinds(trap, "checkpoint.signal") and not _kinds(trap, "checkpoint.overdue")
    oks = _kinds(trap, "checkpoint.ok")
    assert oks and "after USR1" in oks[0]["data"]["message"]
    listing = wait_for(lambda: (r := d.ctl("checkpoints", runs["trapper"]))
                       and any(c["verified"] for c in r[0]["checkpoints"]) and r, 30, "a verified checkpoint")
    row = next(c for c in listing[0]["checkpoints"] if c["verified"])
    assert row["complete"] and row["save_s"] is not None and row["save_s"] >= 0.9  # the trap's `sleep 1`
    assert listing[0]["schedule"]["signal"] == "USR1"
    assert listing[0]["schedule"]["young_daly"]["save_s"] is not None

    # careless: USR1 ended its batch shell: SIGNALLED (the daemon's doing), resubmitted, not signalled again.
    def second_attempt() -> dict[str, Any] | None:
        r = d.run(runs["careless"])
        return r if len(r["attempts"]) >= 2 and r["attempts"][1]["state"] == "RUNNING" else None
    status = wait_for(second_attempt, 90, "the careless run to be resubmitted")
    classified = [e for e in status["events"] if e["kind"] == "attempt.classified"]
    assert [e["data"]["outcome"] for e in classified] == ["SIGNALLED"]
    assert classified[0]["data"]["resubmit"] is True
    assert any(e["kind"] == "recovery.resubmit" for e in status["events"])
    first = status["attempts"][0]
    assert first["state"] == "FAILED" and (first["exit_code"], first["signal"]) == (0, 10)
    wait_for(lambda: len(_kinds(_events(d, runs["careless"]), "checkpoint.overdue")) >= 1, 60,
             "the second attempt's alert")
    careless = _events(d, runs["careless"])
    assert len(_kinds(careless, "checkpoint.signal")) == 1  # the one that ended attempt 1
    assert "attempt 1 died of USR1: not signalled again" in _kinds(careless, "checkpoint.overdue")[-1]["data"][
        "message"]

    # An ended run produces nothing: cancel the slipper, let two more signal intervals pass.
    d.ctl("cancel", runs["slipper"])
    d.wait_run(runs["slipper"], {"CANCELLED"}, timeout=60)
    before = len(_events(d, runs["slipper"]))
    seen = len(_kinds(_events(d, runs["trapper"]), "checkpoint.signal"))
    wait_for(lambda: len(_kinds(_events(d, runs["trapper"]), "checkpoint.signal")) >= seen + 2, 60,
             "two more checkpoint passes with signals")
    assert len(_events(d, runs["slipper"])) == before
