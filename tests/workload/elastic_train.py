"""A small PyTorch Elastic training script for the tests (CPU, gloo), run by torchrun.

What every elastic training script must do (docs/elastic.md): at every worker start
(torchrun restarts the workers whenever a member leaves or joins) load the newest complete
checkpoint and go on from its step. Rank and world size come from torchrun (``RANK``,
``WORLD_SIZE``); the process group has a short timeout (``--timeout``) so the survivors of a
silent peer fail fast and re-rendezvous.

Checkpoints: every ``--ckpt-every`` steps rank 0 writes ``$B300_CHECKPOINT_DIR/step_<N>/model.pt``
then ``DONE`` (the ``generic`` layout). Rank 0 writes ``progress.json`` beside the checkpoint
folder every step (step, world size, the nodes) and each worker start appends a line to
``history.jsonl`` there; every rank appends progress protocol lines to
``$B300_PROGRESS_FILE`` when the job has one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def newest(root: Path) -> tuple[int, Path | None]:
    best: tuple[int, Path | None] = (0, None)
    for d in root.glob("step_*"):
        m = re.fullmatch(r"step_(\d+)", d.name)
        if m and (d / "DONE").exists() and int(m.group(1)) > best[0]:
            best = (int(m.group(1)), d)
    return best


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-s", type=float, default=0.5)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--timeout", type=float, default=10.0)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    root = Path(os.environ["B300_CHECKPOINT_DIR"])
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    start, ckpt = newest(root)
    if ckpt is not None:
        model.load_state_dict(torch.load(ckpt / "model.pt"))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    nodes: list[str | None] = [None] * world
    dist.all_gather_object(nodes, node)
    progress = None
    if os.environ.get("B300_PROGRESS_FILE"):
        from b300.training.progress import ProgressWriter

        progress = ProgressWriter(os.environ["B300_PROGRESS_FILE"], host=node, rank=rank)
    if rank == 0:
        with open(root.parent / "history.jsonl", "a") as f:
            f.write(json.dumps({"start": start, "world": world, "nodes": nodes, "time": time.time(),
                                "job": os.environ.get("SLURM_JOB_ID"),
                                "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT")}) + "\n")
    g = torch.Generator().manual_seed(rank)
    for step in range(start + 1, args.steps + 1):
        t0 = time.time()
        x = torch.randn(32, 16, generator=g)
        loss = (ddp(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_s)
        if progress is not None:
            progress.step(step, loss=loss.item(), step_time_s=time.time() - t0)
        if rank == 0:
            _atomic(root.parent / "progress.json", json.dumps(
                {"step": step, "world": world, "nodes": nodes, "time": time.time(),
                 "job": os.environ.get("SLURM_JOB_ID")}))
            if step % args.ckpt_every == 0:
                d = root / f"step_{step}"
                d.mkdir(exist_ok=True)
                torch.save(model.state_dict(), d / "model.pt")
                (d / "DONE").write_text("")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
