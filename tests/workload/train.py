"""A small but real data-parallel training job for the tests (PyTorch on CPU, gloo).

Run under Slurm with one task per node: ``srun python train.py --steps 40``.
Rank and world size come from ``SLURM_PROCID``/``SLURM_NTASKS``; every
``--ckpt-every`` steps it saves a torch.distributed.checkpoint (DCP) under
``$B300_CHECKPOINT_DIR/step_<N>`` (``__<rank>_0.distcp`` per rank, then
``.metadata`` last); rank 0 writes ``progress.json`` every step and appends what
each attempt did to ``history.jsonl`` beside the checkpoint folder. It resumes
from ``$B300_RESUME_FROM`` when that names a checkpoint.

Fault knobs for the tests (all only on attempt 1, so the resubmission is clean):
``--hang-at N`` rank 0 stops making progress at step N; ``--fail-at N`` every
rank (only rank R with ``--fail-rank R``, its peers then see the
connection close) raises an ordinary error at step N (exit 1); ``--torn-at N`` rank 1 stalls
inside the save of step N after rank 0 wrote its shard, so a node killed then
leaves a checkpoint without ``.metadata``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.nn.parallel import DistributedDataParallel


class _StallingWriter(FileSystemWriter):
    """Rank ``stall_rank`` stalls before writing its shard (a slow or dying node)."""

    def __init__(self, path: str, stall: bool) -> None:
        super().__init__(path)
        self._stall = stall

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        if self._stall:
            time.sleep(3600)
        return super().write_data(plan, planner)


def _atomic_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--step-time", type=float, default=0.2)
    ap.add_argument("--hang-at", type=int, default=-1)
    ap.add_argument("--fail-at", type=int, default=-1)
    ap.add_argument("--torn-at", type=int, default=-1)
    ap.add_argument("--fail-rank", type=int, default=-1)
    # The first attempt waits after this step (its checkpoint saved) until --gate exists
    # (at most 10 minutes): a test can fail a node while the job surely still trains.
    ap.add_argument("--pause-at", type=int, default=-1)
    ap.add_argument("--gate", default="")
    args = ap.parse_args()

    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    job_id = int(os.environ["SLURM_JOB_ID"])
    attempt = int(os.environ.get("B300_ATTEMPT", "1"))
    ckpt_root = Path(os.environ["B300_CHECKPOINT_DIR"])
    resume = os.environ.get("B300_RESUME_FROM", "")
    run_dir = ckpt_root.parent
    # A step relaunched inside the same job (spare_nodes; b300.launcher) is generation 1, 2...
    generation = int(os.environ.get("B300_STEP_GENERATION") or 0)
    first = attempt == 1 and generation == 0
    # Several local clusters on one machine reuse the same job ids: the cluster's name
    # keeps their rendezvous ports apart (and the step id those of a job's steps).
    step_id = int(os.environ.get("SLURM_STEP_ID", "0") or 0)
    port = 21000 + (job_id + 7919 * step_id
                    + zlib.crc32(os.environ.get("SLURM_CLUSTER_NAME", "").encode())) % 20000

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=__import__("datetime").timedelta(seconds=600))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if resume:
        state = {"model": model.state_dict(), "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=resume)
        model.load_state_dict(state["model"])
        step = int(state["step"])
    if rank == 0:
        with open(run_dir / "history.jsonl", "a") as f:
            f.write(json.dumps({"attempt": attempt, "job_id": job_id, "start_step": step,
                                "resume_from": resume, "nodes": os.environ.get(
                                    "SLURM_JOB_NODELIST", ""), "generation": generation,
                                "step_id": step_id, "step_nodes": os.environ.get(
                                    "SLURM_STEP_NODELIST", ""), "time": time.time()}) + "\n")
        print(f"attempt {attempt} job {job_id} starts at step {step} (resume={resume!r})",
              flush=True)

    while step < args.steps:
        if first and step == args.fail_at and args.fail_rank in (-1, rank):
            raise RuntimeError(f"bad hyperparameters at step {step}")
        if first and rank == 0 and step == args.hang_at:
            print(f"rank 0 stuck at step {step}", flush=True)
            time.sleep(3600)
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        step += 1
        time.sleep(args.step_time)
        if rank == 0:
            _atomic_json(run_dir / "progress.json", {"step": step, "time": time.time(),
                                                     "attempt": attempt})
        if step % args.ckpt_every == 0:
            stall = first and rank == 1 and step == args.torn_at
            path = ckpt_root / f"step_{step:06d}"
            dcp.save({"model": model.state_dict(), "step": torch.tensor(step)},
                     storage_writer=_StallingWriter(str(path), stall))
        if first and step == args.pause_at:
            gate, waited = Path(args.gate), 0.0
            while not gate.exists() and waited < 600:
                time.sleep(0.25)
                waited += 0.25
    # Both ranks leave together; then exit hard, so no lingering gloo/store thread
    # can keep the task (and so srun and the job) alive after the work is done.
    dist.barrier()
    if rank == 0:
        _atomic_json(run_dir / "done.json", {"step": step, "attempt": attempt, "job_id": job_id})
        print(f"done at step {step}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
