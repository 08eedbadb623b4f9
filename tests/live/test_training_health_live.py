"""Training health end to end (issue 17): the real CPU workload (PyTorch, gloo, 2 nodes)
on the real cluster, a real b300d, alerts POSTed to a webhook on loopback.

One faulty run injects, one after the other, a slow rank (it sleeps its own work per
step), a loss spike, a NaN loss and a checkpoint save that never ends; each must come
back as its ``training.*`` event and its alert within a minute of the moment the
workload wrote it happened (``injected.jsonl``). A clean run beside it, on the other
two nodes, gets none. Bounded waits only: a late signal fails the wait, no duration
is asserted.

The restart-loop test: a job that fails every attempt before any checkpoint, with a
retryable exit code and a large retry budget, is stopped after ``attempts`` (2)
attempts with ``recovery.restart_loop``. The "do not restart" test: a declared exit
code, and a job's ``exit_intent`` before a retryable exit, end their runs without a
resubmission (``recovery.no_restart``).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import DaemonHandle, make_daemon, wait_for

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parent.parent / "workload" / "train.py"
ALERT_BOUND_S = 60  # "within a minute" of the condition
TRAINING_KINDS = ("training.loss_spike", "training.loss_nan", "training.throughput_drop",
                  "training.straggler", "training.checkpoint_stalled")


@pytest.fixture
def hook() -> Iterator[tuple[list[dict[str, Any]], int]]:
    """A webhook receiver on loopback: the alerts b300d POSTs."""
    posts: list[dict[str, Any]] = []

    class _Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            posts.append({**json.loads(body), "received": time.time()})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield posts, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _daemon(tmp_path: Path, slurm_conf: str, hook_port: int, metrics_port: int = 0) -> DaemonHandle:
    d = make_daemon(tmp_path, slurm_conf, poll_interval="1s")
    metrics = f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n' if metrics_port else ""
    d.config.write_text(d.config.read_text() + metrics + (
        f'[alerts]\nwebhook_url = "http://127.0.0.1:{hook_port}/hook"\nscan_interval = "1s"\n'
        # Thresholds for a job of a minute (the defaults are for days-long runs).
        "[training.loss]\nwindow = 20\nmin_points = 10\n"
        "[training.straggler]\nsteps = 5\n"
        '[training.checkpoint_stall]\ntimeout = "15s"\nmin_timeout = "10s"\n'))
    d.start()
    return d


def _spec(tmp_path: Path, name: str, *train_args: str, nodes: int = 2, steps: int = 120,
          health: tuple[str, ...] = (), retries: tuple[str, ...] = (), ckpt_every: int = 1000,
          progress_file: bool = True) -> Path:
    run_dir = tmp_path / name
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    progress = str(run_dir / "progress.{host}.jsonl")
    writes = f"--progress-file {shlex.quote(progress)} " if progress_file else ""
    command = (f"srun {sys.executable} {TRAIN} --steps {steps} --ckpt-every {ckpt_every} --step-time 0.2 "
               f"{writes}{' '.join(train_args)}")
    spec = tmp_path / f"{name}.toml"
    spec.write_text("\n".join([
        f'name = "{name}"', "[job]", f"command = {json.dumps(command)}", f"nodes = {nodes}",
        "ntasks_per_node = 1", "gpus_per_node = 8", 'time_limit = "00:15:00"',
        "[checkpoint]", f'dir = "{run_dir / "ckpt"}"', 'layout = "dcp"',
        "[retries]", *retries,
        "[health]", *([f"progress_file = {json.dumps(progress)}"] if progress_file else []),
        "model_params = 1000000", *health,
    ]) + "\n")
    return spec


def _injected(tmp_path: Path, name: str) -> dict[str, float]:
    """What the workload injected so far, and when (its own clock)."""
    path = tmp_path / name / "injected.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return {(doc := json.loads(line))["what"]: float(doc["time"]) for line in lines if line.strip()}


def _events(d: DaemonHandle, run_id: str, kind: str) -> list[dict[str, Any]]:
    """The run's events of ``kind``, read from the daemon's store (cheaper than b300ctl per poll)."""
    from b300.store import open_store

    store = open_store(d.database_url)
    try:
        return [{"ts": e.ts.timestamp(), "kind": e.kind, "node": e.node, "data": e.data,
                 "attempt_id": e.attempt_id} for e in store.events(run_id=run_id, kinds=[kind])]
    finally:
        store.close()


def test_injected_faults_are_found_and_alerted_a_clean_run_is_not(
    tmp_path: Path, slurm_conf: str, hook: tuple[list[dict[str, Any]], int]
) -> None:
    posts, port = hook
    metrics_port = _free_port()
    d = _daemon(tmp_path, slurm_conf, port, metrics_port)
    try:
        clean = d.submit(_spec(tmp_path, "clean", steps=150))
        faulty = d.submit(_spec(tmp_path, "faulty", "--slow-rank", "1", "--slow-s", "0.3",
                                "--slow-from", "15", "--loss-spike-at", "45", "--nan-at", "60",
                                "--ckpt-stall-at", "75"))
        expected = [("slow rank", "training.straggler"), ("loss spike", "training.loss_spike"),
                    ("nan", "training.loss_nan"), ("checkpoint stall", "training.checkpoint_stalled")]
        for what, kind in expected:
            # The condition first (bounded: the job must get there), then its signal within a minute.
            wait_for(lambda w=what: w in _injected(tmp_path, "faulty"), 240, f"the workload to inject {what}")
            event = wait_for(lambda k=kind: _events(d, faulty, k), ALERT_BOUND_S,
                             f"the {kind} event after the {what}", every=1.0)[0]
            alert = wait_for(lambda k=kind: [p for p in posts if p["kind"] == k and p["run_id"] == faulty],
                             ALERT_BOUND_S, f"the {kind} alert", every=0.5)[0]
            at = _injected(tmp_path, "faulty")[what]
            print(f"{kind}: event {event['ts'] - at:.1f} s, alert {alert['received'] - at:.1f} s after "
                  f"the injection; {event['data']['evidence']}")
            nodes = d.run(faulty)["attempts"][-1]["nodes"]
            if kind == "training.straggler":  # rank 1 runs on the allocation's second node
                assert event["node"] == nodes[1] and alert["node"] == nodes[1]
        # The figures of the running attempts: recorded for the report, and in /metrics.
        figures = _events(d, faulty, "training.figures")
        assert figures and figures[0]["data"]["step"] >= 1
        m = _scrape(metrics_port)
        run = (("run", faulty),)
        assert m["b300_training_step"][run] >= 75 and m["b300_training_checkpoint_saves_open"][run] == 1
        assert m["b300_training_mfu"][run] > 0 and m["b300_training_tokens_per_second"][run] > 0
        assert m["b300_training_straggler"][(("host", nodes[1]), *run)] == 1
        assert m["b300_training_host_step_time_seconds"][(("host", nodes[1]), *run)] >= 0.3
        for kind in ("loss_spike", "loss_nan", "straggler", "checkpoint_stalled"):
            assert m["b300_training_findings_total"][(("kind", kind), *run)] == 1
        print("metrics:", {k: v[run] for k, v in m.items() if k.startswith("b300_training_") and run in v})

        d.wait_run(clean, {"COMPLETED"}, timeout=300)
        found = [e for k in TRAINING_KINDS for e in _events(d, clean, k)]
        assert found == [], found
        assert [p for p in posts if p["run_id"] == clean] == []
        d.ctl("cancel", faulty)
    finally:
        d.cleanup()


def test_a_restarted_daemon_does_not_alert_again(
    tmp_path: Path, slurm_conf: str, hook: tuple[list[dict[str, Any]], int]
) -> None:
    """b300d killed (SIGKILL) after a loss spike was alerted, restarted while the job goes
    on; its first start after that drops its state file too (as a failover to the other
    host would): the spike is recorded and alerted once, and a second spike after the
    restarts is found."""
    posts, port = hook
    d = _daemon(tmp_path, slurm_conf, port)
    try:
        run_id = d.submit(_spec(tmp_path, "restart", "--loss-spike-at", "30", "--nan-at", "250",
                                steps=300))
        wait_for(lambda: [p for p in posts if p["kind"] == "training.loss_spike"], 240, "the spike alert")
        d.kill()
        d.proc = None
        d.start()
        d.kill()
        d.proc = None
        for state in (d.state_dir / "training").glob("attempt-*.json"):
            state.unlink()
        d.start()
        wait_for(lambda: [p for p in posts if p["kind"] == "training.loss_nan"], 240, "the NaN alert")
        d.wait_run(run_id, {"COMPLETED"}, timeout=300)
        assert len(_events(d, run_id, "training.loss_spike")) == 1
        assert len([p for p in posts if p["kind"] == "training.loss_spike"]) == 1
        assert len(_events(d, run_id, "training.loss_nan")) == 1
    finally:
        d.cleanup()


@pytest.mark.skipif(not os.environ.get("B300_LONG_TESTS"), reason="10 minutes: set B300_LONG_TESTS=1")
def test_a_ten_minute_clean_run_raises_nothing(
    tmp_path: Path, slurm_conf: str, hook: tuple[list[dict[str, Any]], int]
) -> None:
    """No false alarm over 10 minutes of a healthy 2-node job that checkpoints every 100
    steps, under this test's sensitive thresholds, with the throughput detector judging
    too (its windows shortened to minutes)."""
    posts, port = hook
    d = _daemon(tmp_path, slurm_conf, port)
    d.kill(15)
    d.proc = None
    d.config.write_text(d.config.read_text() + (
        '[training.throughput]\nsustain = "1m"\nbaseline = "4m"\nmin_baseline = "2m"\n'))
    d.start()
    seconds = float(os.environ.get("B300_CLEAN_RUN_S", "600"))
    try:
        run_id = d.submit(_spec(tmp_path, "clean10", steps=int(seconds / 0.2), ckpt_every=100))
        d.wait_run(run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=seconds * 3 + 300)
        assert d.run(run_id)["run"]["state"] == "COMPLETED"
        found = [e for k in TRAINING_KINDS for e in _events(d, run_id, k)]
        assert found == [], found
        assert [p for p in posts if p["run_id"] == run_id] == []
        figures = _events(d, run_id, "training.figures")
        ended = [line for f in (tmp_path / "clean10").glob("progress.*.jsonl")
                 for line in f.read_text().splitlines() if '"ckpt_end"' in line]
        print(f"clean run: {len(figures)} figures records, {len(ended)} checkpoint saves, no finding")
        assert len(ended) >= 5
    finally:
        d.cleanup()


def test_megatron_lines_in_the_job_output_are_read(
    tmp_path: Path, slurm_conf: str, hook: tuple[list[dict[str, Any]], int]
) -> None:
    """No progress file: ``megatron_log = true`` reads Megatron-LM's iteration lines from the
    job's output (written by the workload as Megatron formats them); a loss spike and a
    NaN iteration are found and alerted from them."""
    posts, port = hook
    d = _daemon(tmp_path, slurm_conf, port)
    try:
        spec = _spec(tmp_path, "megatron", "--megatron-log", "--loss-spike-at", "30", "--nan-at", "45",
                     steps=80, health=("megatron_log = true", "tokens_per_sample = 16"), progress_file=False)
        run_id = d.submit(spec)
        for what, kind in (("loss spike", "training.loss_spike"), ("nan", "training.loss_nan")):
            wait_for(lambda w=what: w in _injected(tmp_path, "megatron"), 240, f"the workload to inject {what}")
            event = wait_for(lambda k=kind: _events(d, run_id, k), ALERT_BOUND_S, f"the {kind} event",
                             every=1.0)[0]
            wait_for(lambda k=kind: [p for p in posts if p["kind"] == k and p["run_id"] == run_id],
                     ALERT_BOUND_S, f"the {kind} alert", every=0.5)
            print(f"megatron {kind}: {event['data']['evidence']}")
        d.wait_run(run_id, {"COMPLETED"}, timeout=300)
        assert not list((tmp_path / "megatron").glob("progress.*.jsonl"))
    finally:
        d.cleanup()


def test_restart_loop_is_stopped_after_k_attempts(
    tmp_path: Path, slurm_conf: str, hook: tuple[list[dict[str, Any]], int]
) -> None:
    posts, port = hook
    d = _daemon(tmp_path, slurm_conf, port)
    try:
        run_id = d.submit(_spec(
            tmp_path, "loop", "--fail-at", "3", "--fail-code", "75", "--fail-every-attempt", nodes=1,
            retries=("infra = 10", "retryable_exit_codes = [75]"),
            health=("[health.signals.restart_loop]", "attempts = 2")))
        status = d.wait_run(run_id, {"FAILED", "COMPLETED", "CANCELLED"}, timeout=300)
        assert status["run"]["state"] == "FAILED"
        loop = _events(d, run_id, "recovery.restart_loop")
        assert len(loop) == 1, [e["kind"] for e in status["events"]]
        assert "restart loop" in loop[0]["data"]["why"] and loop[0]["data"]["attempts"] == [1, 2]
        assert len(status["attempts"]) == 2
        assert len(_events(d, run_id, "recovery.resubmit")) == 1
        wait_for(lambda: [p for p in posts if p["kind"] == "recovery.restart_loop"], ALERT_BOUND_S,
                 "the restart-loop alert")
    finally:
        d.cleanup()


def test_do_not_restart_exits_end_the_run(
    tmp_path: Path, slurm_conf: str, hook: tuple[list[dict[str, Any]], int]
) -> None:
    posts, port = hook
    d = _daemon(tmp_path, slurm_conf, port)
    try:
        declared = d.submit(_spec(tmp_path, "declared", "--fail-at", "3", "--fail-code", "3", nodes=1,
                                  health=("no_restart_exit_codes = [3]",)))
        # A retryable exit would be resubmitted; the job's own "do not restart" wins.
        intent = d.submit(_spec(tmp_path, "intent", "--fail-at", "3", "--fail-code", "75",
                                "--no-restart-intent", "'loss diverged; needs a person'", nodes=1,
                                retries=("retryable_exit_codes = [75]",)))
        for run_id, why in ((declared, "exit code 3 is declared not to be restarted"),
                            (intent, "the job asked not to be restarted: loss diverged; needs a person")):
            status = d.wait_run(run_id, {"FAILED", "COMPLETED", "CANCELLED"}, timeout=300)
            assert status["run"]["state"] == "FAILED"
            stop = _events(d, run_id, "recovery.no_restart")
            assert len(stop) == 1 and why in stop[0]["data"]["why"], [e["kind"] for e in status["events"]]
            assert len(status["attempts"]) == 1 and not _events(d, run_id, "recovery.resubmit")
            wait_for(lambda r=run_id: [p for p in posts if p["kind"] == "recovery.no_restart"
                                       and p["run_id"] == r], ALERT_BOUND_S, "the no-restart alert")
        assert _events(d, intent, "training.exit_intent")[0]["data"]["restart"] is False
    finally:
        d.cleanup()
