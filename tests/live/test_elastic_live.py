"""PyTorch Elastic runs (issue 33) on the namespace cluster with real torchrun (CPU, gloo).

One module, one cluster of its own (``B300_NETNS=1``, SlurmdTimeout 300 s, so every
detection here is the daemon's), one daemon, one run: 2 agents + 1 spare. A node powered
off mid-training -> the daemon drains it and starts an agent on the spare, training goes on
at world size 2 with the spare, in the same Slurm job; a kill -9 of the daemon changes
nothing (it comes back with its liveness checks off); then a second member powered off
and set DOWN in Slurm (``scontrol update state=down``, as Slurm does itself after
``SlurmdTimeout``) with no spare left -> the daemon finds the death in Slurm's node view and
the run shrinks to its minimum (``on_no_spare = "shrink"``), still in the same job; a
second kill -9 changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import DaemonHandle, SideCluster, cancel_test_jobs, make_daemon, slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
TRAIN = Path(__file__).resolve().parents[1] / "workload" / "elastic_train.py"
_SIDE = SideCluster("ELASTIC", "b300eltest", 17500, "/var/tmp/b300-elastic-test")
_lc = _SIDE.lc
_must = _SIDE.must


@pytest.fixture(scope="module")
def conf() -> Iterator[str]:
    with _SIDE.running() as slurm_conf:
        yield slurm_conf


def _spec(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "ckpt").mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "elastic.toml"
    spec.write_text("\n".join([
        'name = "elastic"', "[job]",
        f"command = {json.dumps(f'{TRAIN} --steps 100000 --step-s 0.3 --ckpt-every 5 --timeout 10')}",
        "nodes = 2", "spare_nodes = 1", "gpus_per_node = 0", 'time_limit = "00:20:00"',
        "[job.environment]", 'GLOO_SOCKET_IFNAME = "eth0"',
        "[checkpoint]", f'dir = "{run / "ckpt"}"', 'layout = "generic"',
        "[health]", f'progress_file = "{run / "progress.{host}.jsonl"}"', 'hang_timeout = "30m"',
        "[retries]", "infra = 3",
        "[elastic]", "min_nodes = 1", "max_nodes = 2", "max_restarts = 3", "port = 29561",
        'on_no_spare = "shrink"',
    ]) + "\n")
    return spec


def _progress(tmp_path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((tmp_path / "run" / "progress.json").read_text()))
    except (OSError, ValueError):
        return {}


def _starts(tmp_path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    except OSError:
        return []


def _kinds(d: DaemonHandle, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in d.ctl("events", "--run", run_id) if e["kind"] == kind]


def _trained_on(tmp_path: Path, world: int, node: str | None, since: float) -> dict[str, Any] | None:
    """The first worker start at ``world`` (with ``node`` in it) after ``since`` once training
    has gone 3 steps past it."""
    for s in _starts(tmp_path):
        if s["time"] > since and s["world"] == world and (node is None or node in s["nodes"]):
            p = _progress(tmp_path)
            if p.get("world") == world and p.get("step", 0) >= s["start"] + 3:
                return s
    return None


def test_a_lost_member_is_replaced_by_the_spare_then_the_run_shrinks(conf: str, tmp_path: Path) -> None:
    d = make_daemon(tmp_path, conf)
    d.config.write_text(d.config.read_text() + "[liveness]\nenabled = true\n")
    d.start()
    try:
        run_id = d.submit(_spec(tmp_path))
        wait_for(lambda: _progress(tmp_path).get("step", 0) >= 7 and _progress(tmp_path).get("world") == 2,
                 120, "training on 2 nodes past a checkpoint")
        attempt = d.run(run_id)["attempts"][-1]
        job_id, nodes = attempt["job_id"], list(attempt["nodes"])
        assert len(nodes) == 3, attempt
        batch_host, victim, spare = nodes
        assert sorted(_progress(tmp_path)["nodes"]) == [batch_host, victim]

        # 1. A member powered off: an agent starts on the spare, same job, back to 2.
        t0 = time.time()
        _must("power-off", victim)
        back = wait_for(lambda: _trained_on(tmp_path, 2, spare, t0), 150, "training again with the spare")
        took = time.time() - t0
        assert back["job"] == str(job_id) and back["start"] >= 5, back
        left = _kinds(d, run_id, "elastic.member_left")
        joined = _kinds(d, run_id, "elastic.member_joined")
        assert [(e["data"]["node"], e["data"]["then"]) for e in left] == [(victim, "replace")], left
        assert [(e["data"]["node"], e["data"]["replaces"]) for e in joined] == [(spare, victim)], joined
        assert any(e["kind"] == "node.drained" for e in d.ctl("events", "--node", victim))
        print(f"\nelastic: node {victim} off -> training again on {back['nodes']} after {took:.1f} s, "
              f"from step {back['start']}")

        # 2. kill -9 of the daemon: nothing changes (no new attempt, no new elastic event).
        # It comes back without its liveness checks: from now on only Slurm tells it.
        d.kill()
        d.config.write_text(d.config.read_text().replace("[liveness]\nenabled = true\n",
                                                         "[liveness]\nenabled = false\n"))
        assert "enabled = false" in d.config.read_text()
        d.start()
        step = _progress(tmp_path)["step"]
        wait_for(lambda: _progress(tmp_path)["step"] >= step + 5, 60, "training on after the restart")
        assert len(d.run(run_id)["attempts"]) == 1
        assert len(_kinds(d, run_id, "elastic.member_left")) == 1
        assert len(_kinds(d, run_id, "elastic.member_joined")) == 1

        # 3. The spare (now a member) powered off and DOWN in Slurm, no spare left: the death
        # is found in Slurm's node view, the run shrinks to 1.
        t1 = time.time()
        _must("power-off", spare)
        slurm_cmd(conf, "scontrol", "update", f"NodeName={spare}", "State=DOWN", "Reason=test: bad board")
        alone = wait_for(lambda: _trained_on(tmp_path, 1, batch_host, t1), 150, "training on alone")
        assert alone["job"] == str(job_id), alone
        left = wait_for(lambda: [e for e in _kinds(d, run_id, "elastic.member_left")
                                 if e["data"]["node"] == spare], 30, "the death recorded")
        assert [(e["data"]["then"], e["data"]["cause"]) for e in left] == [("shrink", "slurm")], left
        lost = [e["data"] for e in _kinds(d, run_id, "attempt.node_lost") if e["data"]["nodes"] == [spare]]
        assert [x["evidence"] for x in lost] == ["Slurm reports DOWN (test: bad board)"], lost
        assert len(d.run(run_id)["attempts"]) == 1
        print(f"elastic: node {spare} off and DOWN in Slurm, no spare -> training on {alone['nodes']} after "
              f"{time.time() - t1:.1f} s, from step {alone['start']}")

        # 4. kill -9 again: the death Slurm reported is not decided twice.
        d.kill()
        d.start()
        step = _progress(tmp_path)["step"]
        wait_for(lambda: _progress(tmp_path)["step"] >= step + 5, 60, "training on after the restart")
        assert len(_kinds(d, run_id, "elastic.member_left")) == 2
        assert len(_kinds(d, run_id, "elastic.member_joined")) == 1
        assert len(d.run(run_id)["attempts"]) == 1
    finally:
        d.cleanup()
        cancel_test_jobs(conf, d)
        for n in ("gpu01", "gpu02", "gpu03", "gpu04"):
            _lc("power-on", n, timeout=60)
        _lc("up")
