"""A training-like job in the standard library only (no torch), for runs whose user
cannot reach the test's own Python (b300d running as user ``b300``).

Every task sleeps ``--step-time`` per step; rank 0 writes ``progress.json`` every
step and a generic checkpoint ``$B300_CHECKPOINT_DIR/step_<N>/`` (``state.json``,
then the ``DONE`` marker) every ``--ckpt-every`` steps, resumes from
``$B300_RESUME_FROM`` when it names one, appends what each attempt did to
``history.jsonl`` and writes ``done.json`` at the end (all beside the checkpoint
folder). With ``--pause-at N --gate FILE`` every task waits after step N until FILE
exists (at most 10 minutes), so a test can act while the job surely still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _atomic_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--step-time", type=float, default=0.4)
    ap.add_argument("--pause-at", type=int, default=-1)
    ap.add_argument("--gate", default="")
    args = ap.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    ckpt_root = Path(os.environ["B300_CHECKPOINT_DIR"])
    run_dir = ckpt_root.parent
    resume = os.environ.get("B300_RESUME_FROM", "")
    step = json.loads((Path(resume) / "state.json").read_text())["step"] if resume else 0
    if rank == 0:
        with open(run_dir / "history.jsonl", "a") as f:
            f.write(json.dumps({"attempt": int(os.environ.get("B300_ATTEMPT", "1")),
                                "start_step": step, "resume_from": resume,
                                "node": os.environ.get("SLURMD_NODENAME", "")}) + "\n")
    while step < args.steps:
        time.sleep(args.step_time)
        step += 1
        if rank == 0:
            _atomic_json(run_dir / "progress.json", {"step": step, "time": time.time()})
            if step % args.ckpt_every == 0:
                ckpt = ckpt_root / f"step_{step:06d}"
                ckpt.mkdir(parents=True, exist_ok=True)
                _atomic_json(ckpt / "state.json", {"step": step})
                (ckpt / "DONE").touch()
        if step == args.pause_at:
            gate, waited = Path(args.gate), 0.0
            while not gate.exists() and waited < 600:
                time.sleep(0.25)
                waited += 0.25
    if rank == 0:
        _atomic_json(run_dir / "done.json", {"step": step})


if __name__ == "__main__":
    main()
