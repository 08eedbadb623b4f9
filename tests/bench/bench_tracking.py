#!/usr/bin/env python3
"""Benchmark: the daemon's batched poll cycle against a naive squeue-per-job tracker.

Runs against the real local Slurm cluster (``deploy/localcluster.sh up``)::

    python tests/bench/bench_tracking.py [--queued 10000] [--tracked 1000] [--cycles 5]

1. Queues ``--queued`` held jobs (``sbatch --hold``) in slurmctld, several sbatch
   processes at a time. The first ``--tracked`` are attempts of runs created in a
   fresh SQLite store (job name = the attempt's tag); the rest are filler.
2. Runs ``--cycles`` cycles of the daemon's poll cycle (``PollCycle.run_once``) and
   ``--naive-cycles`` cycles of a naive tracker (one ``squeue -j ID`` per job).
   For each: Slurm tool runs, CPU (this process and its child processes), wall
   time, and slurmctld RPCs from ``sdiag`` (reset before, read after every cycle).
   The Slurm tools of both trackers run as ``--rpc-user`` (default ``nobody``,
   through ``setpriv``, about 1 ms per tool run, measured and printed) so that
   sdiag's per-user count separates their RPCs from other users of the cluster;
   sdiag's per-type counts cover every user.
3. Checks every tracked attempt is PENDING with a held reason after each cycle.
4. Prints a table, naive/daemon ratios and, last, one JSON line with every figure.

Every job it submitted is cancelled on exit (also on Ctrl-C or SIGTERM); it
never touches other jobs, nodes or the cluster's daemons.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pwd
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from b300.cycle.pipeline import PollCycle
from b300.cycle.run_actions import RunActions
from b300.cycle.track import AttemptTracker
from b300.cycle.view import ClusterObserver
from b300.model import AttemptState
from b300.ops.logs import configure_logging
from b300.slurm.cli import CliSlurmClient
from b300.slurm.parse import parse_sbatch
from b300.slurm.script import attempt_tag
from b300.spec import parse_spec
from b300.store import open_store

DEFAULT_CONF = "/var/tmp/b300-cluster/etc/slurm.conf"
TOOL_TIMEOUT_S = 60.0
SCANCEL_CHUNK = 500
SPEC_TOML = """\
name = "bench"

[job]
command = "true"
nodes = 1
gpus_per_node = 0
"""
# sdiag counts its own requests under this type; they are not the trackers' load.
SDIAG_OWN = "REQUEST_STATS_INFO"
MAIN_TYPES = (
    "REQUEST_JOB_INFO",
    "REQUEST_JOB_INFO_SINGLE",
    "REQUEST_JOB_USER_INFO",
    "REQUEST_NODE_INFO",
    "REQUEST_PARTITION_INFO",
    "REQUEST_FED_INFO",
)


# -- sdiag (pure) ------------------------------------------------------------------------------

_RPC_LINE = re.compile(
    r"^\s+(?P<name>\S+)\s+\(\s*(?P<id>\d+)\)\s+count:(?P<count>\d+)\s+"
    r"ave_time:(?P<ave>\d+)\s+total_time:(?P<total>\d+)"
)
_SINCE_LINE = re.compile(r"^Data since\s.*\((?P<epoch>\d+)\)\s*$")


@dataclass(frozen=True, slots=True)
class RpcStat:
    count: int
    total_us: int


@dataclass(frozen=True, slots=True)
class Sdiag:
    """The parts of ``sdiag`` output this benchmark uses."""

    since: int | None
    by_type: dict[str, RpcStat]
    by_user: dict[str, RpcStat]


def parse_sdiag(text: str) -> Sdiag:
    """Parse ``sdiag`` output: the "Data since" epoch and both RPC statistics sections.

    Lines that do not look like RPC statistics are ignored; a missing section
    gives an empty dict.
    """
    since: int | None = None
    by_type: dict[str, RpcStat] = {}
    by_user: dict[str, RpcStat] = {}
    section: dict[str, RpcStat] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            m = _SINCE_LINE.match(line)
            if m:
                since = int(m.group("epoch"))
            if line.startswith("Remote Procedure Call statistics by message type"):
                section = by_type
            elif line.startswith("Remote Procedure Call statistics by user"):
                section = by_user
            else:
                section = None
            continue
        m = _RPC_LINE.match(line)
        if section is not None and m:
            section[m.group("name")] = RpcStat(int(m.group("count")), int(m.group("total")))
    return Sdiag(since, by_type, by_user)


def rpc_delta(after: Mapping[str, RpcStat], before: Mapping[str, RpcStat]) -> dict[str, RpcStat]:
    """Per-key difference of two sdiag snapshots (keys with no change are dropped)."""
    out = {}
    for key, stat in after.items():
        prev = before.get(key, RpcStat(0, 0))
        diff = RpcStat(stat.count - prev.count, stat.total_us - prev.total_us)
        if diff.count:
            out[key] = diff
    return out


# -- running tools -----------------------------------------------------------------------------


def slurm_env(conf: str) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": conf, "LC_ALL": "C"}


def run_tool(argv: Sequence[str], env: Mapping[str, str], *, timeout: float = TOOL_TIMEOUT_S,
             prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, env=dict(env),
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def as_user(user: str) -> list[str]:
    """argv prefix running a tool as ``user``.

    ``setpriv`` rather than ``subprocess.run(user=...)``: the latter cannot use
    vfork and costs this process ~4 ms CPU per run, which would inflate the
    naive tracker's figures; setpriv adds ~1 ms to the child instead.
    """
    pw = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]


def wrapper_overhead(env: Mapping[str, str], prefix: Sequence[str], n: int = 100) -> dict[str, float]:
    """Per tool run, what ``prefix`` adds (ms): wall, this process's CPU, children's CPU."""

    def per_run(pre: Sequence[str]) -> tuple[float, float, float]:
        w0, c0, k0 = time.monotonic(), time.process_time(), children_cpu()
        for _ in range(n):
            run_tool(["true"], env, prefix=pre)
        return ((time.monotonic() - w0) / n * 1e3, (time.process_time() - c0) / n * 1e3,
                (children_cpu() - k0) / n * 1e3)

    if not prefix:
        return {"wall_ms": 0.0, "cpu_self_ms": 0.0, "cpu_children_ms": 0.0}
    plain, wrapped = per_run(()), per_run(prefix)
    return {key: round(w - p, 2) for key, w, p in
            zip(("wall_ms", "cpu_self_ms", "cpu_children_ms"), wrapped, plain, strict=True)}


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class SdiagProbe:
    """Resets sdiag, then reads per-cycle deltas; notices a reset by anyone else."""

    def __init__(self, env: Mapping[str, str], rpc_user: str | None) -> None:
        self._env = env
        self._user = rpc_user
        self.error: str | None = None
        self._since: int | None = None
        self._last: Sdiag | None = None

    def _read(self) -> Sdiag | None:
        proc = run_tool(["sdiag"], self._env)
        if proc.returncode != 0:
            self.error = f"sdiag failed: {proc.stderr.strip()[:200]}"
            return None
        return parse_sdiag(proc.stdout)

    def reset(self) -> None:
        proc = run_tool(["sdiag", "--reset"], self._env)
        if proc.returncode != 0:
            self.error = f"sdiag --reset failed (needs root): {proc.stderr.strip()[:200]}"
            return
        self._last = self._read()
        self._since = self._last.since if self._last else None

    def delta(self) -> dict[str, Any] | None:
        """RPCs since the previous call: by type (all users), total, and the bench user's."""
        if self._last is None:
            return None
        now = self._read()
        if now is None:
            return None
        if now.since != self._since:
            self.error = ("sdiag statistics were reset by someone else (or slurmctld restarted)"
                          " during the measurement: RPC figures are incomplete")
        by_type = rpc_delta(now.by_type, self._last.by_type)
        by_type.pop(SDIAG_OWN, None)
        by_user = rpc_delta(now.by_user, self._last.by_user)
        self._last = now
        user = by_user.get(self._user) if self._user else None
        return {
            "by_type": {k: v.count for k, v in sorted(by_type.items())},
            "total": sum(v.count for v in by_type.values()),
            "ctld_ms": sum(v.total_us for v in by_type.values()) / 1000.0,
            "user": user.count if user else (0 if self._user else None),
            "user_ctld_ms": user.total_us / 1000.0 if user else (0.0 if self._user else None),
        }


# -- setup ---------------------------------------------------------------------------------------


def sbatch_held(name: str, env: Mapping[str, str], stop: threading.Event) -> int:
    argv = ["sbatch", "--hold", "--parsable", f"--job-name={name}", "--output=/dev/null",
            "--wrap", "true"]
    last = ""
    for attempt in range(4):
        if attempt and stop.is_set():
            break
        try:
            proc = run_tool(argv, env)
        except subprocess.TimeoutExpired:
            last = "timed out"  # it may still have been queued: the cleanup sweep finds it
        else:
            if proc.returncode == 0:
                return int(parse_sbatch(proc.stdout))
            last = " ".join(proc.stderr.split())[:200]
        time.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"sbatch {name}: {last}")


def submit_all(names: Sequence[str], env: Mapping[str, str], workers: int,
               sink: list[int], stop: threading.Event) -> list[int]:
    """Submit one held job per name with ``workers`` sbatch processes in flight.

    Every job id is appended to ``sink`` as soon as it is known, so the caller
    can cancel them whatever happens here.
    """
    ids: list[int | None] = [None] * len(names)
    counter = itertools.count()
    lock = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            with lock:
                i = next(counter)
            if i >= len(names):
                return
            job_id = sbatch_held(names[i], env, stop)
            with lock:
                ids[i] = job_id
                sink.append(job_id)

    pool = ThreadPoolExecutor(max_workers=workers)
    futures: list[Future[None]] = [pool.submit(worker) for _ in range(workers)]
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=10, return_when=FIRST_EXCEPTION)
            for fut in done:
                fut.result()  # raises a worker's error
            print(f"  submitted {len(sink)}/{len(names)}", file=sys.stderr, flush=True)
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
    assert all(i is not None for i in ids)
    return [int(i) for i in ids if i is not None]


def count_jobs(env: Mapping[str, str]) -> int:
    proc = run_tool(["squeue", "--noheader", "--states=all", "--format=%i"], env)
    return len(proc.stdout.split()) if proc.returncode == 0 else -1


def max_job_count(env: Mapping[str, str]) -> int | None:
    proc = run_tool(["scontrol", "show", "config"], env)
    m = re.search(r"^MaxJobCount\s*=\s*(\d+)", proc.stdout, re.MULTILINE)
    return int(m.group(1)) if m else None


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class CycleFigures:
    tracker: str
    cycle: int
    tracked: int
    changed: int
    calls: int
    tools: dict[str, int]
    cpu_self_s: float
    cpu_children_s: float
    wall_s: float
    mismatches: int
    rpc: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def cpu_total_s(self) -> float:
        return self.cpu_self_s + self.cpu_children_s


def check_store(store: Any, expected: Mapping[int, int], *, want_reason: bool) -> list[str]:
    """Tracked attempts not PENDING (or, once observed, without a held reason)."""
    bad = []
    seen = {a.id: a for a in store.active_attempts()}
    for attempt_id, job_id in expected.items():
        a = seen.get(attempt_id)
        if a is None:
            bad.append(f"attempt {attempt_id} (job {job_id}) is no longer active")
        elif a.state is not AttemptState.PENDING or a.slurm_job_id != job_id:
            bad.append(f"{a.tag} job {a.slurm_job_id}: {a.state.value} ({a.reason})")
        elif want_reason and not a.reason.startswith("JobHeld"):
            bad.append(f"{a.tag} job {job_id}: PENDING but reason {a.reason!r} (not observed?)")
    return bad


def measure_daemon(tracker: PollCycle, client: CliSlurmClient, store: Any,
                   expected: Mapping[int, int], probe: SdiagProbe,
                   cycles: int) -> list[CycleFigures]:
    out = []
    probe.reset()
    for n in range(1, cycles + 1):
        tools0 = dict(client.calls)
        child0 = children_cpu()
        report = tracker.run_once()
        child_s = children_cpu() - child0
        rpc = probe.delta()
        tools = {k: v - tools0.get(k, 0) for k, v in client.calls.items() if v - tools0.get(k, 0)}
        bad = check_store(store, expected, want_reason=True)
        for line in bad[:5]:
            print(f"  daemon cycle {n} mismatch: {line}", file=sys.stderr)
        out.append(CycleFigures("daemon", n, report.tracked, report.changed, report.slurm_calls,
                                tools, report.cpu_s, child_s, report.wall_s, len(bad), rpc,
                                list(report.errors)))
    return out


def measure_naive(job_ids: Sequence[int], env: Mapping[str, str], prefix: Sequence[str],
                  probe: SdiagProbe, cycles: int) -> list[CycleFigures]:
    """One ``squeue -h -j ID -o %T`` per tracked job per cycle, one after the other."""
    out = []
    probe.reset()
    for n in range(1, cycles + 1):
        cpu0, child0, wall0 = time.process_time(), children_cpu(), time.monotonic()
        bad: list[str] = []
        for job_id in job_ids:
            proc = run_tool(["squeue", "-h", "-j", str(job_id), "-o", "%T"], env, prefix=prefix)
            state = proc.stdout.strip()
            if proc.returncode != 0 or state != "PENDING":
                bad.append(f"job {job_id}: rc={proc.returncode} {state or proc.stderr.strip()}")
        wall = time.monotonic() - wall0
        cpu, child = time.process_time() - cpu0, children_cpu() - child0
        rpc = probe.delta()
        for line in bad[:5]:
            print(f"  naive cycle {n} mismatch: {line}", file=sys.stderr)
        out.append(CycleFigures("naive", n, len(job_ids), 0, len(job_ids),
                                {"squeue": len(job_ids)}, cpu, child, wall, len(bad), rpc))
    return out


# -- reporting -----------------------------------------------------------------------------------


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(rows: Sequence[CycleFigures]) -> dict[str, Any]:
    rpcs = [r.rpc for r in rows if r.rpc is not None]
    types: dict[str, float] = {}
    for rpc in rpcs:
        for key, count in rpc["by_type"].items():
            types[key] = types.get(key, 0) + count / len(rpcs)
    users = [rpc["user"] for rpc in rpcs if rpc["user"] is not None]
    user_ms = [rpc["user_ctld_ms"] for rpc in rpcs if rpc["user_ctld_ms"] is not None]
    return {
        "cycles": len(rows),
        "calls": mean([r.calls for r in rows]),
        "cpu_self_s": mean([r.cpu_self_s for r in rows]),
        "cpu_children_s": mean([r.cpu_children_s for r in rows]),
        "cpu_total_s": mean([r.cpu_total_s for r in rows]),
        "wall_s": mean([r.wall_s for r in rows]),
        "rpc_total": mean([rpc["total"] for rpc in rpcs]) if rpcs else None,
        "rpc_user": mean(users) if users else None,
        "ctld_ms": mean([rpc["ctld_ms"] for rpc in rpcs]) if rpcs else None,
        "user_ctld_ms": mean(user_ms) if user_ms else None,
        "rpc_by_type": {k: round(v, 2) for k, v in sorted(types.items())},
        "mismatches": sum(r.mismatches for r in rows),
    }


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: Sequence[CycleFigures]) -> None:
    head = (f"{'tracker':<7} {'cyc':>3} {'tracked':>7} {'changed':>7} {'calls':>6} "
            f"{'tools':<20} {'rpc(all)':>8} {'rpc(usr)':>8} {'ctld_ms':>8} {'cpu_self':>8} "
            f"{'cpu_kids':>8} {'wall_s':>7} {'bad':>4}")
    print(head)
    print("-" * len(head))
    for r in rows:
        tools = " ".join(f"{k}:{v}" for k, v in sorted(r.tools.items()))
        rpc = r.rpc or {}
        print(f"{r.tracker:<7} {r.cycle:>3} {r.tracked:>7} {r.changed:>7} {r.calls:>6} "
              f"{tools:<20} {fmt(rpc.get('total'), 'd'):>8} {fmt(rpc.get('user'), 'd'):>8} "
              f"{fmt(rpc.get('ctld_ms'), '.1f'):>8} {r.cpu_self_s:>8.3f} "
              f"{r.cpu_children_s:>8.3f} {r.wall_s:>7.3f} {r.mismatches:>4}")
        for err in r.errors:
            print(f"        error: {err}")


SUMMARY_ROWS = (
    ("Slurm tool runs", "calls", ".1f"),
    ("ctld RPCs (all users)", "rpc_total", ".1f"),
    ("ctld RPCs (bench user)", "rpc_user", ".1f"),
    ("ctld RPC ms (all users)", "ctld_ms", ".1f"),
    ("ctld RPC ms (bench user)", "user_ctld_ms", ".1f"),
    ("CPU self s", "cpu_self_s", ".3f"),
    ("CPU children s", "cpu_children_s", ".3f"),
    ("CPU total s", "cpu_total_s", ".3f"),
    ("wall s", "wall_s", ".3f"),
)


def print_summary(daemon: Mapping[str, Any], steady: Mapping[str, Any] | None,
                  naive: Mapping[str, Any], ratios: Mapping[str, float | None],
                  ratios_steady: Mapping[str, float | None]) -> None:
    """Means per cycle; "steady" leaves out the daemon's first cycle (its one-off writes)."""
    st = steady or {}
    print()
    print(f"per cycle (mean)         {'daemon':>10} {'daemon 2..':>10} {'naive':>10} "
          f"{'naive/daemon':>12} {'naive/2..':>10}")
    for label, key, spec in SUMMARY_ROWS:
        print(f"{label:<24} {fmt(daemon.get(key), spec):>10} {fmt(st.get(key), spec):>10} "
              f"{fmt(naive.get(key), spec):>10} {fmt(ratios.get(key), '.1f'):>12} "
              f"{fmt(ratios_steady.get(key), '.1f'):>10}")
    print()
    print("ctld RPCs per cycle by message type (all users; sdiag's own requests excluded)")
    print(f"  {'':<40} {'daemon':>10} {'naive':>10}")
    types = sorted(set(daemon["rpc_by_type"]) | set(naive["rpc_by_type"]),
                   key=lambda t: (t not in MAIN_TYPES, t))
    for t in types:
        print(f"  {t:<40} {daemon['rpc_by_type'].get(t, 0):>10.1f} "
              f"{naive['rpc_by_type'].get(t, 0):>10.1f}")


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


# -- cleanup -------------------------------------------------------------------------------------


def chunks(items: Sequence[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def cleanup(job_ids: Sequence[int], token: str, env: Mapping[str, str],
            workers: int) -> dict[str, Any]:
    """Cancel every job this run submitted (by id), then any left with our token in its name."""
    t0 = time.monotonic()
    errors: list[str] = []

    def scancel(ids: list[int]) -> None:
        try:
            proc = run_tool(["scancel", *map(str, ids)], env, timeout=180)
        except subprocess.TimeoutExpired:
            errors.append(f"scancel of {len(ids)} jobs timed out")
            return
        if proc.returncode != 0:
            errors.append(" ".join(proc.stderr.split())[:200])

    ids = sorted(set(job_ids))
    with ThreadPoolExecutor(max_workers=max(1, min(workers, 4))) as pool:
        list(pool.map(scancel, chunks(ids, SCANCEL_CHUNK)))
    # Jobs whose sbatch timed out or was interrupted after queueing them.
    left: list[int] = []
    try:
        proc = run_tool(["squeue", "--noheader", "--format=%i|%j"], env)
        left = [int(line.split("|", 1)[0]) for line in proc.stdout.splitlines()
                if "|" in line and token in line.split("|", 1)[1]]
    except (subprocess.TimeoutExpired, ValueError) as exc:
        errors.append(f"sweep: {exc}")
    for chunk in chunks(left, SCANCEL_CHUNK):
        scancel(chunk)
    return {"cancelled": len(ids), "swept": len(left), "seconds": round(time.monotonic() - t0, 1),
            "errors": errors[:5]}


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queued", type=int, default=10_000, help="held jobs to queue (10000)")
    p.add_argument("--tracked", type=int, default=1000, help="of those, tracked by runs (1000)")
    p.add_argument("--cycles", type=int, default=5, help="daemon poll cycles (5)")
    p.add_argument("--naive-cycles", type=int, default=1,
                   help="naive tracker cycles (1: each costs one squeue per tracked job)")
    p.add_argument("--workers", type=int, default=6, help="parallel sbatch processes (6)")
    p.add_argument("--slurm-conf", default=os.environ.get("SLURM_CONF", DEFAULT_CONF))
    p.add_argument("--rpc-user", default="nobody",
                   help="run the trackers' Slurm tools as this user so sdiag's per-user "
                        "count isolates them (needs root; '' = as yourself)")
    args = p.parse_args(argv)
    if not 1 <= args.tracked <= args.queued:
        p.error("need 1 <= --tracked <= --queued")
    if args.cycles < 1 or args.naive_cycles < 0 or args.workers < 1:
        p.error("--cycles and --workers must be >= 1, --naive-cycles >= 0")
    return args


def _terminate(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = slurm_env(args.slurm_conf)
    rpc_user: str | None = args.rpc_user or None
    if rpc_user is not None:
        try:
            pwd.getpwnam(rpc_user)
        except KeyError:
            rpc_user = None
        if os.geteuid() != 0 or shutil.which("setpriv") is None:
            rpc_user = None
    token = secrets.token_hex(3)
    tmp = Path(tempfile.mkdtemp(prefix="b300-bench-"))
    submitted: list[int] = []
    stop = threading.Event()
    result: dict[str, Any] = {"bench": "tracking", "queued": args.queued,
                              "tracked": args.tracked, "rpc_user": rpc_user, "token": token}
    t_start = time.monotonic()
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with INT ignored
    rc = 0
    store = None
    log_file = None
    try:
        if run_tool(["sinfo", "--noheader"], env).returncode != 0:
            print(f"no Slurm cluster at {args.slurm_conf}: run deploy/localcluster.sh up",
                  file=sys.stderr)
            return 2
        before = count_jobs(env)
        limit = max_job_count(env)
        result["jobs_in_controller_before"] = before
        if limit is not None and before + args.queued > limit:
            print(f"{before} jobs already in slurmctld + {args.queued} > MaxJobCount={limit}",
                  file=sys.stderr)
            return 2
        log_file = (tmp / "daemon.log").open("w")
        configure_logging("json", "info", stream=log_file)  # as b300d logs: JSON, info
        store = open_store(f"sqlite:///{tmp}/state.db")
        clock: Callable[[], datetime] = partial(datetime.now, UTC)
        parse_spec(SPEC_TOML, where="bench spec")

        t0 = time.monotonic()
        attempts = []
        for i in range(args.tracked):
            run_id = f"bench-{token}-{i:05d}"
            store.create_run(run_id, "bench", SPEC_TOML, clock())
            attempts.append(store.begin_attempt(run_id, clock()))
        assert all(a.tag == attempt_tag(a.run_id, 1) for a in attempts)
        names = [a.tag for a in attempts]
        names += [f"bench-filler-{token}-{i}" for i in range(args.tracked, args.queued)]
        store_s = time.monotonic() - t0

        print(f"queueing {args.queued} held jobs with {args.workers} parallel sbatch "
              f"({before} jobs already in slurmctld)", file=sys.stderr)
        t0 = time.monotonic()
        job_ids = submit_all(names, env, args.workers, submitted, stop)
        submit_s = time.monotonic() - t0
        t0 = time.monotonic()
        expected = {}
        for attempt, job_id in zip(attempts, job_ids, strict=False):
            store.confirm_attempt(attempt.id, job_id, clock())
            expected[attempt.id] = job_id
        store_s += time.monotonic() - t0
        result["setup"] = {"submit_s": round(submit_s, 1),
                           "submit_per_s": round(args.queued / submit_s, 1),
                           "store_s": round(store_s, 1), "workers": args.workers,
                           "jobs_in_controller": count_jobs(env)}
        print(f"queued {args.queued} jobs in {submit_s:.1f} s "
              f"({args.queued / submit_s:.0f}/s); store setup {store_s:.1f} s; "
              f"slurmctld now holds {result['setup']['jobs_in_controller']} job records",
              file=sys.stderr)

        prefix = as_user(rpc_user) if rpc_user else []
        overhead = wrapper_overhead(env, prefix)
        result["wrapper_overhead_per_tool_run"] = overhead

        def runner(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*prefix, *argv], **kw)

        client = CliSlurmClient(slurm_conf=args.slurm_conf, timeout=TOOL_TIMEOUT_S, runner=runner)
        tracker = PollCycle(store=store, slurm=client, actions=RunActions(store, client, clock),
                            observer=ClusterObserver(client, store),
                            tracker=AttemptTracker(store, clock, recovering=False), clock=clock)
        probe = SdiagProbe(env, rpc_user)
        print(f"daemon tracker: {args.cycles} cycles", file=sys.stderr)
        daemon_rows = measure_daemon(tracker, client, store, expected, probe, args.cycles)
        print(f"naive tracker: {args.naive_cycles} cycle(s) of {len(expected)} squeue each",
              file=sys.stderr)
        naive_rows = measure_naive(list(expected.values()), env, prefix, probe,
                                   args.naive_cycles)

        print()
        print(f"{args.queued} held jobs queued ({result['setup']['jobs_in_controller']} job "
              f"records in slurmctld), {len(expected)} tracked; Slurm tools run as "
              f"{rpc_user or 'this user'}; naive tracker ran {args.naive_cycles} cycle(s)")
        print_table(daemon_rows + naive_rows)
        d, nv = summarize(daemon_rows), summarize(naive_rows)
        steady = summarize(daemon_rows[1:]) if len(daemon_rows) > 1 else None
        ratios = {key: ratio(nv.get(key), d.get(key)) for _, key, _ in SUMMARY_ROWS}
        ratios_steady = {key: ratio(nv.get(key), (steady or {}).get(key))
                         for _, key, _ in SUMMARY_ROWS}
        print_summary(d, steady, nv, ratios, ratios_steady)
        if probe.error:
            print(f"WARNING: {probe.error}")
        other = {t: c for t, c in {**d["rpc_by_type"], **nv["rpc_by_type"]}.items()
                 if t not in MAIN_TYPES}
        if other:
            print("note: message types other than the trackers' (other users of the cluster, "
                  "slurmd traffic) are in the all-users figures: " + ", ".join(sorted(other)))
        if prefix:
            print(f"note: running each tool through setpriv as {rpc_user} adds, per tool run, "
                  f"{overhead['wall_ms']:.1f} ms wall, {overhead['cpu_children_ms']:.1f} ms "
                  f"children CPU, {overhead['cpu_self_ms']:.2f} ms own CPU (not subtracted)")
        print(f"correctness: {d['mismatches']} daemon and {nv['mismatches']} naive mismatches "
              f"(tracked attempts not PENDING/held after a cycle)")
        result.update({"daemon": d, "daemon_steady": steady, "naive": nv, "ratios": ratios,
                       "ratios_steady": ratios_steady,
                       "cycles": [vars(r) for r in daemon_rows + naive_rows],
                       "sdiag_warning": probe.error})
        if d["mismatches"] or nv["mismatches"]:
            rc = 1
    except KeyboardInterrupt as exc:
        print(f"interrupted ({str(exc) or 'Ctrl-C'}): cleaning up", file=sys.stderr)
        rc = 130
    finally:
        stop.set()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the cleanup finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if submitted:
            print(f"cancelling {len(submitted)} jobs", file=sys.stderr)
        result["cleanup"] = cleanup(submitted, token, env, args.workers)
        if store is not None:
            store.close()
        if log_file is not None:
            log_file.close()
        shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    result["total_s"] = round(time.monotonic() - t_start, 1)
    print(f"cleanup: {result['cleanup']}; total {result['total_s']} s")
    print(json.dumps(result, sort_keys=True, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
