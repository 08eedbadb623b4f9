"""What reading the config and a spec costs a fresh process (docs/benchmarks.md, "Reading
the config and a spec").

Each case runs in a new interpreter (``python -c``), ``--runs`` times, and reports the CPU
time of that process's case (``time.process_time``, less disturbed by other load on the
machine than wall time) and its wall time, min and median. ``--pythonpath DIR`` puts DIR
first on ``sys.path``, so a folder holding a ``b300`` link to another checkout's
``daemon/`` measures that checkout with the same interpreter; ``--against DIR`` measures
this checkout and that one in turn, run by run, so both see the same load::

    mkdir -p /tmp/old/pkg && ln -s /path/to/old-checkout/daemon /tmp/old/pkg/b300
    python tests/bench/bench_config_load.py [--runs 15] [--against /tmp/old/pkg]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "b300.toml"
SPEC = 'name = "x"\\n[job]\\ncommand = "a"\\nnodes = 1\\n[checkpoint]\\ninterval = "1h"\\n'
CASES = {
    "import b300.config": "import b300.config",
    "import b300.spec": "import b300.spec",
    "load_config (first)": f"from b300.config import load_config; load_config({str(EXAMPLE)!r})",
    "parse_spec (first)": f"from b300.spec import parse_spec; parse_spec('{SPEC}')",
    "load_config + parse_spec": (f"from b300.config import load_config; from b300.spec import parse_spec; "
                                 f"load_config({str(EXAMPLE)!r}); parse_spec('{SPEC}')"),
    "import pydantic.main (reference)": "import pydantic.main",
}
_PROBE = ("import time; c, w = time.process_time(), time.perf_counter()\n{code}\n"
          "print((time.process_time() - c) * 1000, (time.perf_counter() - w) * 1000)")


def _run(code: str, pythonpath: str | None) -> tuple[float, float]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", _PROBE.format(code=code)], capture_output=True, text=True,
                         env=env, cwd="/", timeout=120, check=True)
    cpu, wall = out.stdout.split()
    return float(cpu), float(wall)


def _summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    cpu, wall = [s[0] for s in samples], [s[1] for s in samples]
    return {"cpu_ms_min": round(min(cpu), 1), "cpu_ms_median": round(statistics.median(cpu), 1),
            "wall_ms_min": round(min(wall), 1), "wall_ms_median": round(statistics.median(wall), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--pythonpath", help="a folder put first on sys.path (another checkout's b300)")
    ap.add_argument("--against", help="also measure this folder's b300, alternating run by run")
    args = ap.parse_args()
    sides = {"this": args.pythonpath} | ({"against": args.against} if args.against else {})
    result: dict[str, dict[str, dict[str, float]]] = {side: {} for side in sides}
    print(f"{'case':34} {'side':8} {'cpu ms min':>10} {'median':>8} {'wall ms min':>12} {'median':>8}")
    for name, code in CASES.items():
        samples: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for _ in range(args.runs):
            for side, path in sides.items():
                samples[side].append(_run(code, path))
        for side in sides:
            r = result[side][name] = _summary(samples[side])
            print(f"{name:34} {side:8} {r['cpu_ms_min']:10.1f} {r['cpu_ms_median']:8.1f} "
                  f"{r['wall_ms_min']:12.1f} {r['wall_ms_median']:8.1f}")
    print(json.dumps({"runs": args.runs, "load": os.getloadavg()[0], "sides": sides, "cases": result}))


if __name__ == "__main__":
    main()
