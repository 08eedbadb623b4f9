"""Node triage's pure parts: the decisions, the verdicts, the config and the shipped node check
(run for real, with stand-in nvidia-smi/dcgmi/all_reduce_perf on PATH: GPU tools only)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from b300.config import load_config
from b300.errors import ConfigError
from b300.events import Kind
from b300.model import Event, NodeObservation
from b300.ops.alerts import alerts_for
from b300.ops.health import CycleSnapshot
from b300.ops.metrics import MetricsSnapshot, render_metrics
from b300.triage import node_check
from b300.triage.checks import CheckTable, TriageConfig
from b300.triage.decide import Follow, Lemon, Start, cause_of, decide, histories, judge, time_limit_s
from b300.triage.figures import triage_figures
from b300.triage.slurm import job_script

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
ON = TriageConfig(enabled=True, lemon_drains=3, lemon_window_s=86400.0, max_parallel=2)


def ev(i: int, kind: str, node: str, ago_s: float, **data: object) -> Event:
    return Event(id=i, ts=NOW - timedelta(seconds=ago_s), kind=kind, run_id=None, attempt_id=None,
                 node=node, actor="daemon", data=dict(data))


def drained(name: str, reason: str = "b300: node dead (b300d checks): no sshd") -> NodeObservation:
    return NodeObservation(name=name, state="DRAINED", reason=reason)


@pytest.mark.parametrize(("reason", "cause"), [
    ("b300: run r1 job 12 FAILED on n1", "attempt"),
    ("b300: node dead (b300d checks): sshd refused", "liveness"),
    ("b300: straggler in run r1 job 5: 0.4x median", "straggler"),
    ("b300: black hole: failed 3 runs in 1h", "blackhole"),
    ("b300: triage failed gpu-ecc: 2 uncorrectable", None),   # triage's own: never again
    ("bad DIMM, ticket 123", None),                           # a person's drain: theirs
])
def test_cause_of_reads_the_daemons_reasons_only(reason: str, cause: str | None) -> None:
    assert cause_of(reason) == cause


def test_off_by_default_decides_nothing() -> None:
    assert TriageConfig().enabled is False
    assert decide([drained("n1")], {}, TriageConfig(), NOW) == []


def test_a_drained_node_is_triaged_once_per_drain_and_within_the_parallel_limit() -> None:
    nodes = [drained("n1"), drained("n2"), drained("n3"), NodeObservation("n4", "IDLE")]
    hist = histories([ev(1, Kind.NODE_DRAINED, n, 60) for n in ("n1", "n2", "n3")])
    acts = decide(nodes, hist, ON, NOW)
    assert [(type(a), a.node) for a in acts] == [(Start, "n1"), (Start, "n2")]
    assert isinstance(acts[0], Start) and acts[0].cause == "liveness"
    assert acts[0].time_limit_s == time_limit_s(ON.check) == 660.0
    # n1 judged after its drain: left alone; n2 open: followed, not started again
    hist = histories([ev(1, Kind.NODE_DRAINED, "n1", 60), ev(2, Kind.TRIAGE_STARTED, "n1", 50),
                      ev(3, Kind.TRIAGE_VERDICT, "n1", 10, verdict="fail"),
                      ev(4, Kind.NODE_DRAINED, "n2", 60), ev(5, Kind.TRIAGE_STARTED, "n2", 50)])
    acts = decide(nodes[:2], hist, ON, NOW)
    assert [(type(a), a.node) for a in acts] == [(Follow, "n2")]
    # drained again after its verdict: triaged again
    seq = ((1, Kind.NODE_DRAINED, 600), (2, Kind.TRIAGE_STARTED, 500), (3, Kind.TRIAGE_VERDICT, 400),
           (4, Kind.NODE_DRAINED, 5))
    hist = histories([ev(i, k, "n1", s) for i, k, s in seq])
    assert [type(a) for a in decide([drained("n1")], hist, ON, NOW)] == [Start]


def test_a_person_drained_node_is_never_triaged() -> None:
    assert decide([drained("n1", "RMA: bad PSU")], {}, ON, NOW) == []


def test_a_lemon_is_judged_without_checks_and_an_override_makes_it_returnable() -> None:
    drains = [ev(i, Kind.NODE_DRAINED, "n1", 3600 * i) for i in (1, 2, 3)]
    acts = decide([drained("n1")], histories(drains), ON, NOW)
    assert len(acts) == 1 and isinstance(acts[0], Lemon) and acts[0].drains == 3
    # the oldest drain outside the window: not a lemon
    old = [ev(1, Kind.NODE_DRAINED, "n1", 90000), *drains[:2]]
    assert [type(a) for a in decide([drained("n1")], histories(old), ON, NOW)] == [Start]
    # an operator override: drains before it no longer count
    over = [*drains[1:], ev(3, Kind.NODE_DRAINED, "n1", 100),
            ev(9, Kind.TRIAGE_OVERRIDE, "n1", 50, returnable=True), ev(10, Kind.NODE_DRAINED, "n1", 10)]
    assert [type(a) for a in decide([drained("n1")], histories(over), ON, NOW)] == [Start]


def step(name: str, code: int) -> str:
    return json.dumps({"step": name, "exit": code})


def test_judge_names_the_first_failed_check_or_step() -> None:
    ok = "\n".join([json.dumps({"check": "gpu", "status": "skip", "evidence": "nvidia-smi not found"}),
                    json.dumps({"check": "disk", "status": "pass", "evidence": "/ 30% free"}),
                    step("node-check", 0)])
    v = judge(ok, 0, "COMPLETED", ["node-check"])
    assert (v.verdict, v.failed_check) == ("pass", None) and "skipped: gpu" in v.evidence
    bad = json.dumps({"check": "gpu-ecc", "status": "fail", "evidence": "GPU 0: 2 uncorrectable ECC errors"})
    v = judge(bad + "\n" + step("node-check", 1), 0, "COMPLETED", ["node-check"])
    assert (v.verdict, v.failed_check) == ("fail", "gpu-ecc") and "2 uncorrectable" in v.evidence
    v = judge(ok + "\n" + step("nccl", 124), 0, "COMPLETED", ["node-check", "nccl"])
    assert (v.verdict, v.failed_check, v.evidence) == ("fail", "nccl", "nccl: timed out")
    v = judge("", None, "TIMEOUT", ["node-check"])
    assert (v.verdict, v.failed_check) == ("fail", "node-check") and "TIMEOUT" in v.evidence
    v = judge(ok, 1, "FAILED", ["node-check"])
    assert (v.verdict, v.failed_check) == ("fail", "job")


def test_config_rules(tmp_path: Path) -> None:
    path = tmp_path / "b300.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[triage]\nenabled = true\nlemon_drains = 2\n'
                    '[[triage.check]]\nname = "node-check"\nargs = ["--min-busbw", "100"]\n'
                    '[[triage.check]]\nname = "nccl"\nargv = ["/opt/nccl/all_reduce_perf"]\ntimeout_s = 30\n'
                    'causes = ["straggler"]\n')
    cfg = load_config(str(path)).triage
    assert cfg.enabled and cfg.lemon_drains == 2
    assert [c.name for c in cfg.checks_for("liveness")] == ["node-check"]
    assert [c.name for c in cfg.checks_for("straggler")] == ["node-check", "nccl"]
    path.write_text('[triage]\n[[triage.check]]\nname = "x"\nargv = ["nccl"]\n')
    with pytest.raises(ConfigError, match="absolute path"):
        load_config(str(path))
    path.write_text('[triage]\n[[triage.check]]\nname = "x"\ncauses = ["bored"]\n')
    with pytest.raises(ConfigError, match="causes"):
        load_config(str(path))


def test_a_failed_or_lemon_verdict_is_one_alert() -> None:
    evs = [ev(1, Kind.TRIAGE_VERDICT, "n1", 1, verdict="fail", evidence="xid: 1 Xid lines"),
           ev(2, Kind.TRIAGE_VERDICT, "n2", 1, verdict="pass", evidence="ok"),
           ev(3, Kind.TRIAGE_VERDICT, "n3", 1, verdict="lemon", evidence="drained 3 times")]
    got = [(a.node, a.kind) for a in alerts_for(evs, [], 0)]
    assert got == [("n1", "triage.verdict"), ("n3", "triage.verdict")]


# -- the shipped check, run as the triage job runs it ----------------------------------------


def tool(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


SMI_OK = """
==============NVSMI LOG==============
GPU 00000000:17:00.0
    ECC Errors
        Volatile
            SRAM Correctable                  : 0
            SRAM Uncorrectable                : 0
            DRAM Correctable                  : 4
            DRAM Uncorrectable                : {dram}
    Remapped Rows
        Pending                               : No
        Remapping Failure Occurred            : No
    Clocks Event Reasons
        HW Slowdown                           : Not Active
        HW Thermal Slowdown                   : Not Active
"""


def run_check(tmp_path: Path, *args: str, dram: int = 0,
              busbw: str = "180.5") -> tuple[int, list[dict[str, str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = SMI_OK.format(dram=dram).replace("\n", "\\n")
    tool(bin_dir, "nvidia-smi", f'if [ "$1" = nvlink ]; then echo "GPU 0: Link 0: 26.562 GB/s"; exit 0; fi\n'
                                f'printf "{smi}"\n')
    tool(bin_dir, "dcgmi", 'echo "| Deployment | Pass |"\n')
    tool(bin_dir, "all_reduce_perf", f'sleep 0; echo "# Avg bus bandwidth    : {busbw}"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    src = Path(node_check.__file__).read_text()
    p = subprocess.run([sys.executable, "-", *args], input=src, capture_output=True, text=True, env=env,
                       timeout=60, check=False)
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()]


def test_node_check_passes_a_healthy_node(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[1.0] usual boot lines\n")
    rc, rows = run_check(tmp_path, "--kernel-log", str(log), "--disk", str(tmp_path))
    status = {r["check"]: r["status"] for r in rows if "check" in r}
    assert rc == 0 and rows[-1] == {"verdict": "pass", "failed": []}
    assert status == {"gpu-ecc": "pass", "gpu-pages": "pass", "gpu-throttle": "pass", "nvlink": "pass",
                      "xid": "pass", "dcgm": "pass", "nccl": "pass", "disk": "pass", "ib": status["ib"]}


def test_node_check_fails_on_ecc_xid_and_a_slow_all_reduce(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[9.1] NVRM: Xid (PCI:0000:17:00): 79, pid=0, GPU has fallen off the bus.\n")
    rc, rows = run_check(tmp_path, "--kernel-log", str(log), "--disk", str(tmp_path), "--min-busbw", "150",
                         dram=2, busbw="12.0")
    assert rc == 1 and rows[-1]["failed"] == ["gpu-ecc", "xid", "nccl"]
    ev = {r["check"]: r["evidence"] for r in rows if "check" in r}
    assert "2 uncorrectable ECC" in ev["gpu-ecc"] and "Xid (PCI:0000:17:00): 79" in ev["xid"]
    assert ev["nccl"] == "all-reduce bus bandwidth 12 GB/s < 150 GB/s"


def test_job_script_runs_each_check_under_its_timeout(tmp_path: Path) -> None:
    checks = (CheckTable(name="node-check", args=["--kernel-log", str(tmp_path / "none")], timeout_s=60),
              CheckTable(name="slow", argv=["/bin/sleep", "5"], timeout_s=1))
    script = tmp_path / "job.sh"
    script.write_text(job_script("n1", checks))
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, check=False)
    v = judge(p.stdout, p.returncode, "COMPLETED", ["node-check", "slow"])
    assert (v.verdict, v.failed_check, v.evidence) == ("fail", "slow", "slow: timed out")


def test_report_figures_drains_per_cause_return_times_lemons_and_node_hours() -> None:
    start, end = NOW - timedelta(days=7), NOW
    evs = [ev(1, Kind.NODE_DRAINED, "n1", 7200, reason="b300: node dead (b300d checks): x"),
           ev(2, Kind.NODE_RESUMED, "n1", 6600),                        # back after 10 min
           ev(3, Kind.NODE_DRAINED, "n2", 3600, reason="b300: straggler in run r job 1: slow"),
           ev(4, Kind.TRIAGE_VERDICT, "n2", 3000, verdict="fail"),      # still out: 1 h lost
           ev(5, Kind.NODE_DRAINED, "n3", 1800, reason="b300: run r job 2 FAILED"),
           ev(6, Kind.TRIAGE_VERDICT, "n3", 1700, verdict="lemon"),
           ev(7, Kind.NODE_RESUMED, "n4", 100)]                          # never drained: not counted
    f = triage_figures(evs, start, end)
    assert f.drains_by_cause == {"attempt": 1, "liveness": 1, "straggler": 1}
    assert (f.returns, f.return_median_s, f.return_p95_s) == (1, 600.0, 600.0)
    assert f.outcomes == {"fail": 1, "lemon": 1} and f.lemons == ["n3"]
    assert f.node_hours_lost == pytest.approx(600 / 3600 + 1.0 + 0.5)


def test_metrics_show_verdicts_and_lemon_nodes() -> None:
    text = render_metrics(MetricsSnapshot(cycle=CycleSnapshot(0, 0, 0.0, 0.0, None),
                                          triage_verdicts={"pass": 3, "lemon": 1}, lemon_nodes=("gpu07",)))
    assert 'b300_triage_verdicts_total{verdict="pass"} 3.0' in text
    assert 'b300_lemon_node{node="gpu07"} 1.0' in text


def test_a_node_returned_after_its_verdict_and_drained_again_is_triaged_again() -> None:
    seq = [ev(1, Kind.TRIAGE_STARTED, "n1", 600), ev(2, Kind.TRIAGE_VERDICT, "n1", 500, verdict="pass"),
           ev(3, Kind.NODE_RESUMED, "n1", 500)]
    assert [type(a) for a in decide([drained("n1")], histories(seq), ON, NOW)] == [Start]
    assert decide([drained("n1")], histories(seq[:2]), ON, NOW) == []


@pytest.mark.parametrize("state", ["DRAINING", "MIXED+DRAIN", "ALLOCATED+DRAIN", "DOWN*", "DRAINED~"])
def test_a_node_still_running_jobs_or_not_answering_waits(state: str) -> None:
    hist = histories([ev(1, Kind.NODE_DRAINED, "n1", 60)])
    assert decide([NodeObservation("n1", state, DEAD_REASON)], hist, ON, NOW) == []
    assert [type(a) for a in decide([NodeObservation("n1", "DRAINED", DEAD_REASON)], hist, ON, NOW)] == [Start]


DEAD_REASON = "b300: node dead (b300d checks): no sshd"
