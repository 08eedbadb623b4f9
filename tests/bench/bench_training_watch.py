"""CPU of the poll cycle's training step (b300.training.health_step) at scale: RUNS running
attempts of HOSTS hosts each on a real SQLite store, each host file getting LINES new
progress lines per cycle (a step line with its own step time; rank 0's with loss and
tokens too). Prints the CPU
of the first cycle (each watch built: spec parsed, events read) and the median of the
next ones. A benchmark: prints figures, asserts nothing about time.

    python tests/bench/bench_training_watch.py [RUNS] [HOSTS] [LINES] [CYCLES]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from b300.model import AttemptState
from b300.spec import dump_spec, parse_spec
from b300.store import open_store
from b300.training.health_step import TrainingWatch
from b300.training.thresholds import TrainingConfig

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def main() -> None:
    runs, hosts, lines, cycles = (int(a) for a in (sys.argv[1:] + ["100", "8", "15", "10"][len(sys.argv) - 1:]))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = open_store(f"sqlite:///{root / 'state.db'}")
        nodes = [f"gpu{i:03d}" for i in range(hosts)]
        attempts = []
        for r in range(runs):
            pattern = str(root / f"run{r}" / "progress.{host}.jsonl")
            (root / f"run{r}").mkdir()
            spec = parse_spec(f'name = "b{r}"\n[job]\ncommand = "true"\nnodes = {hosts}\n'
                              f'[health]\nprogress_file = {json.dumps(pattern)}\nmodel_params = 70000000000\n')
            store.create_run(f"b-{r}", f"b{r}", dump_spec(spec), T0)
            a = store.begin_attempt(f"b-{r}", T0)
            store.confirm_attempt(a.id, 1000 + r, T0)
            attempts.append(store.update_attempt(a.id, T0, state=AttemptState.RUNNING, nodes=nodes, start=T0))
        now = [T0]
        watch = TrainingWatch(store, lambda: now[0], lambda: TrainingConfig(), state_dir=str(root / "state"),
                              output_path=lambda a, s: None)
        step = 0
        cpu: list[float] = []
        for _ in range(cycles):
            for r in range(runs):
                for h, host in enumerate(nodes):
                    with open(root / f"run{r}" / f"progress.{host}.jsonl", "a") as f:
                        for i in range(lines):
                            s = step + i + 1
                            line = {"v": 1, "step": s, "time": T0.timestamp() + s, "host": host,
                                    "rank": 8 * h, "step_time_s": 1.0 + 0.01 * (s % 3)}
                            if h == 0:  # loss and tokens from rank 0, as the callbacks write them
                                line |= {"loss": 2.0 + 0.01 * (s % 5), "tokens": s * 4_000_000}
                            f.write(json.dumps(line) + "\n")
            step += lines
            now[0] = T0 + timedelta(seconds=step + 1)
            t = time.process_time()
            watch.check(attempts)
            cpu.append(time.process_time() - t)
        store.close()
    print(f"{runs} runs x {hosts} hosts, {lines} lines per file per cycle ({runs * hosts * lines} lines): "
          f"first cycle {cpu[0] * 1000:.0f} ms CPU, then median {statistics.median(cpu[1:]) * 1000:.0f} ms "
          f"(min {min(cpu[1:]) * 1000:.0f}, max {max(cpu[1:]) * 1000:.0f}) over {cycles - 1} cycles")


if __name__ == "__main__":
    main()
