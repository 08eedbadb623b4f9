"""Benchmark: how long ``b300ctl status`` takes, beside ``squeue``.

Builds a SQLite state store like a busy cluster's history (``--runs`` runs, all
ended, 1-3 attempts each on 2 of 16 nodes, with their events), then times, each
``--repeat`` times as a fresh process (wall clock, one after the other):

- ``b300ctl status --all`` (the list of every run) and ``b300ctl status RUN`` of
  this checkout (``python -m b300.cli``), first with no daemon (b300ctl reads the
  store), then, with ``--daemon``, while a real b300d runs on the store and the
  cluster ``$SLURM_CONF`` names (b300ctl asks it: control op ``status``);
- the same of an older b300 when ``--before PYTHON`` names an interpreter that has
  one installed (``PYTHON -m b300.ctl``), e.g. a venv with ``pip install -e`` of a
  checkout of the commit before;
- ``squeue`` on that cluster (skipped if it does not answer);
- ``python -c pass``, the floor for any Python program.

It prints the median and minimum of each, the ratios to squeue and to the before
figure, the machine's load (figures on a loaded machine are slower), and the modules
that cost most when this checkout's ``status`` reads the store (``-X importtime``),
then, last, one JSON line. The runs are all ended so that the daemon has nothing to
do with them. About a minute with the defaults:

    python tests/bench/bench_ctl.py [--runs 100] [--repeat 20] [--daemon] [--before /path/to/old/python]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

_SPEC = 'name = "bench"\n[job]\ncommand = "true"\nnodes = 2\ngpus_per_node = 8\n'


def make_store(state: Path, runs: int) -> str:
    """A store with ``runs`` ended runs; returns the id of one with three attempts."""
    from b300.interfaces import NewEvent
    from b300.model import AttemptState, NodeObservation, RunState
    from b300.store import open_store

    now = datetime.now(UTC)
    chosen = ""
    with open_store(f"sqlite:///{state / 'state.db'}") as store:
        nodes = [NodeObservation(f"gpu{i:02d}", "IDLE") for i in range(1, 17)]
        store.sync_nodes(nodes, now - timedelta(days=8))
        for i in range(runs):
            run_id = f"bench-{i:04d}"
            t = now - timedelta(hours=runs - i + 2)
            store.create_run(run_id, f"llm-{i}", _SPEC, t)
            attempts = 1 + i % 3
            for n in range(attempts):
                a = store.begin_attempt(run_id, t + timedelta(minutes=10 * n))
                store.confirm_attempt(a.id, 1000 + 10 * i + n, t + timedelta(minutes=10 * n, seconds=1))
                last = n == attempts - 1
                nodes = [f"gpu{(i + k) % 16 + 1:02d}" for k in range(2)]
                store.update_attempt(a.id, t + timedelta(minutes=10 * n + 1), state=AttemptState.RUNNING,
                                     nodes=nodes, start=t + timedelta(minutes=10 * n + 1))
                ended = AttemptState.COMPLETED if last else AttemptState.NODE_FAIL
                store.update_attempt(a.id, t + timedelta(minutes=10 * n + 9), state=ended,
                                     end=t + timedelta(minutes=10 * n + 9), exit_code=0 if last else 1)
            store.set_run_state(run_id, RunState.COMPLETED, t + timedelta(hours=1),
                                events=[NewEvent("recovery.waiting", data={"why": "bench"})])
            if attempts == 3 and not chosen:
                chosen = run_id
    return chosen


@contextlib.contextmanager
def running_daemon(cfg: Path, socket_path: Path, env: dict[str, str], log: Path) -> Iterator[None]:
    """A real b300d on the bench's config, until the block ends (SIGTERM, then waited for)."""
    from b300.control.client import call_daemon
    from b300.errors import DaemonUnavailableError

    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "b300.app.main", "--config", str(cfg)], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"b300d exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if call_daemon(str(socket_path), {"op": "ping"}, timeout=5).get("ok"):
                    break
            except DaemonUnavailableError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("b300d did not answer within 60 s")
            time.sleep(0.2)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def time_program(argv: list[str], repeat: int, env: dict[str, str]) -> list[float]:
    """Wall seconds of ``repeat`` runs of ``argv``; exits if one fails."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=120,
                              check=False)
        out.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return out


def import_costs(argv: list[str], env: dict[str, str], top: int = 8) -> list[tuple[str, float]]:
    """The top-level imports of one run of ``argv`` (``python -X importtime``), costliest first, in ms."""
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    costs = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _self, cumulative, name = line.removeprefix("import time:").split("|")
        if cumulative.strip().isdigit() and not name.startswith("  ") and name.strip() not in ("site",):
            costs.append((name.strip(), int(cumulative) / 1000))
    return sorted(costs, key=lambda c: -c[1])[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="runs in the store (100)")
    ap.add_argument("--repeat", type=int, default=20, help="times each program runs (20)")
    ap.add_argument("--before", metavar="PYTHON", help="an interpreter with an older b300 installed")
    ap.add_argument("--daemon", action="store_true",
                    help="also time status while a b300d runs (needs the cluster $SLURM_CONF names)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ctl-"))  # left for a look at b300d.log
    tmp.chmod(0o700)
    state = tmp / "state"
    state.mkdir(mode=0o750)
    run_id = make_store(state, args.runs)
    cfg = tmp / "b300.toml"
    conf = os.environ.get("SLURM_CONF", "")
    # No node-down trigger: it is a PERM strigger that would outlive the bench's daemon.
    cfg.write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\npoll_interval = \"300s\"\n"
                   f'[slurm]\nbackend = "cli"\nconf = {json.dumps(conf)}\n[recovery]\nnode_trigger = false\n')
    cfg.chmod(0o600)
    env = {**os.environ}
    env.pop("B300_CONFIG", None)
    after = [sys.executable, "-m", "b300.cli", "--config", str(cfg)]
    before = [args.before, "-m", "b300.ctl", "--config", str(cfg)] if args.before else []
    queries = {"status --all": ["status", "--all"], "status RUN": ["status", run_id]}
    programs: dict[str, list[str]] = {"python -c pass": [sys.executable, "-c", "pass"]}
    for what, argv in queries.items():
        programs[f"after: {what}"] = [*after, *argv]
        if before:
            programs[f"before: {what}"] = [*before, *argv]
    squeue_ok = subprocess.run(["squeue", "-h"], capture_output=True, env=env, timeout=30,
                               check=False).returncode == 0
    if squeue_ok:
        programs["squeue"] = ["squeue"]
    load = os.getloadavg()
    times = {name: time_program(argv, args.repeat, env) for name, argv in programs.items()}
    if args.daemon:
        with running_daemon(cfg, state / "b300d.sock", env, tmp / "b300d.log"):
            for what, argv in queries.items():
                times[f"after, b300d up: {what}"] = time_program([*after, *argv], args.repeat, env)
                if before:
                    times[f"before, b300d up: {what}"] = time_program([*before, *argv], args.repeat, env)
    load_after = os.getloadavg()
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"b300ctl status on {args.runs} runs (SQLite), {args.repeat} runs each; "
          f"load {load[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs)")
    print(f"{'program':<36} {'median ms':>10} {'min ms':>8} {'x squeue':>9}")
    for name, t in times.items():
        ratio = f"{med[name] / med['squeue']:.1f}" if squeue_ok else "-"
        print(f"{name:<36} {med[name] * 1000:>10.0f} {min(t) * 1000:>8.0f} {ratio:>9}")
    for way in ("", ", b300d up"):
        for what in queries:
            if f"before{way}: {what}" in med and f"after{way}: {what}" in med:
                print(f"{what}{way}: {med[f'before{way}: {what}'] / med[f'after{way}: {what}']:.1f}x "
                      "faster than before")
    costs = import_costs(programs["after: status --all"], env)
    print("after: status, costliest top-level imports (ms, one run): "
          + ", ".join(f"{name} {ms:.0f}" for name, ms in costs))
    print(json.dumps({"runs": args.runs, "repeat": args.repeat, "load": [load[0], load_after[0]],
                      "median_ms": {k: round(v * 1000, 1) for k, v in med.items()},
                      "min_ms": {k: round(min(t) * 1000, 1) for k, t in times.items()},
                      "imports_ms": dict(costs)}))


if __name__ == "__main__":
    main()
