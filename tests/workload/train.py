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

Training-health knobs (issue 17; also only on attempt 1, except ``--fail-every-attempt``):
``--progress-file PATTERN`` every rank appends progress protocol v1 lines there
(``b300.training.progress.ProgressWriter``; ``{host}``/``{rank}`` expanded): its own
``step_time_s`` (the work before the all-reduce), and on rank 0 the loss and tokens;
``--loss-spike-at N`` the batch of step N is scaled by 30 (a real spike of the real
loss; its optimizer step skipped); ``--nan-at N`` the batch of step N holds a NaN (a
real NaN loss; step skipped); ``--slow-rank R --slow-s S`` rank R sleeps S seconds of
its own work per step from ``--slow-from`` on; ``--ckpt-stall-at N`` rank 0 writes
``ckpt_begin`` for step N and then never ends the save; ``--fail-code C`` the failure
of ``--fail-at`` is exit code C instead of an exception; ``--fail-every-attempt``
fails every attempt, not only the first; ``--no-restart-intent WHY`` writes
``exit_intent`` ``restart: false`` before that failure. Each injection appends
``{"what", "step", "time"}`` to ``injected.jsonl`` beside the checkpoint folder when
it happens (the tests wait for the signal from then on). ``--error-file F --error-code C``: at
any step of any attempt, once F exists, every rank exits C at the same step (F removed): a
fault injected from outside at a time of the injector's choosing; ``--hang-file F``:
once F exists, rank 0 stops making progress (F removed). ``--megatron-log``: rank 0
prints Megatron-LM's iteration line every step, as ``training_log`` in
``megatron/training/training.py`` formats it (NVIDIA/Megatron-LM commit
001b00c2734d8f0fad096fe48a382fedf755d321): a NaN step prints no ``lm loss`` and
counts in ``number of nan iterations``.
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


def _rendezvous_addr() -> str:
    """Rank 0's address: the NodeAddr Slurm holds for the job's first node (127.0.0.1 on
    the loopback local cluster, the node's own address in its network-namespace mode)."""
    import re
    import subprocess
    try:
        first = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                               capture_output=True, text=True, timeout=30, check=True).stdout.split()[0]
        out = subprocess.run(["scontrol", "show", "node", "-o", first], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (KeyError, IndexError, OSError, subprocess.SubprocessError):
        return "127.0.0.1"
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m.group(1) if m else "127.0.0.1"


def _route_ifname(addr: str) -> str | None:
    """The interface this host reaches ``addr`` through: the one holding it (rank 0's own
    host), else the one ``ip route get`` names; None when ``ip`` cannot tell."""
    import re
    import subprocess
    try:
        held = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                              timeout=10, check=True).stdout
        for line in held.splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[2] == "inet" and parts[3].split("/")[0] == addr:
                return parts[1]
        out = subprocess.run(["ip", "-o", "route", "get", addr], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bdev (\S+)", out)
    return m.group(1) if m else None


def _atomic_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _megatron_line(step: int, steps: int, world: int, elapsed_ms: float, loss: float) -> None:
    """One iteration line as Megatron-LM's ``training_log`` prints it (see the module doc)."""
    import datetime as _dt
    import math

    nan = not math.isfinite(loss)
    line = f" [{_dt.datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    line += f" iteration {step:8d}/{steps:8d} |"
    line += f" consumed samples: {step * 8 * world:12d} |"
    line += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    line += f" learning rate: {0.01:.6E} |"
    line += f" global batch size: {8 * world:5d} |"
    if not nan:
        line += " {}: {:.6E} |".format("lm loss", loss)
    line += f" loss scale: {1.0:.1f} |"
    line += f" number of skipped iterations: {int(nan):3d} |"
    line += f" number of nan iterations: {int(nan):3d} |"
    print(line, flush=True)


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
    ap.add_argument("--progress-file", default="")
    ap.add_argument("--loss-spike-at", type=int, default=-1)
    ap.add_argument("--nan-at", type=int, default=-1)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-s", type=float, default=0.0)
    ap.add_argument("--slow-from", type=int, default=0)
    ap.add_argument("--ckpt-stall-at", type=int, default=-1)
    ap.add_argument("--fail-code", type=int, default=0)
    ap.add_argument("--fail-every-attempt", action="store_true")
    ap.add_argument("--no-restart-intent", default="")
    ap.add_argument("--megatron-log", action="store_true")
    ap.add_argument("--error-file", default="")
    ap.add_argument("--error-code", type=int, default=75)
    ap.add_argument("--hang-file", default="")
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
    writer = None
    if args.progress_file:
        from b300.training.progress import ProgressWriter

        writer = ProgressWriter(args.progress_file, rank=rank, strict=True)

    def injected(what: str, at: int) -> None:
        # One short O_APPEND write per line: ranks on one file system do not interleave.
        with open(run_dir / "injected.jsonl", "a") as f:
            f.write(json.dumps({"what": what, "step": at, "rank": rank, "time": time.time()}) + "\n")
    # Several local clusters on one machine reuse the same job ids: the cluster's name
    # keeps their rendezvous ports apart (and the step id those of a job's steps).
    step_id = int(os.environ.get("SLURM_STEP_ID", "0") or 0)
    port = 21000 + (job_id + 7919 * step_id
                    + zlib.crc32(os.environ.get("SLURM_CLUSTER_NAME", "").encode())) % 20000

    addr = _rendezvous_addr()
    if not addr.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
        # Gloo advertises the address of the host name (loopback here) unless told the
        # interface: the one that reaches rank 0 (a node's own link in namespace mode).
        ifname = _route_ifname(addr)
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world, timeout=__import__("datetime").timedelta(seconds=600))
    torch.manual_seed(0)
    # A regression with a noise floor: the loss falls to ~0.25 and stays noisy there, as a
    # real loss curve does (minimising the output alone fell to 1e-9 of float noise, where a
    # 2.8x "spike" is chance: a false alarm in a 10-minute clean live run).
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(1234))
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
        if args.error_file:
            # A fault injected from outside, at any step of any attempt: all ranks agree to
            # fail at the same step (one more all-reduce), so it ends as the job's own error.
            flag = torch.tensor([1 if rank == 0 and os.path.exists(args.error_file) else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if int(flag):
                if rank == 0:
                    os.unlink(args.error_file)
                    injected(f"exit {args.error_code}", step)
                print(f"rank {rank} exits {args.error_code} at step {step} (--error-file)", flush=True)
                sys.stdout.flush()
                os._exit(args.error_code)
        if args.hang_file and rank == 0 and os.path.exists(args.hang_file):
            # Injected from outside: rank 0 stops (its peers wait in the next all-reduce).
            os.unlink(args.hang_file)
            injected("hang", step)
            print(f"rank 0 stuck at step {step} (--hang-file)", flush=True)
            time.sleep(3600)
        failing = first or args.fail_every_attempt
        if failing and step == args.fail_at and args.fail_rank in (-1, rank):
            if args.no_restart_intent and writer is not None and rank == 0:
                writer.exit_intent(step, restart=False, why=args.no_restart_intent)
            if args.fail_code:
                injected(f"exit {args.fail_code}", step)
                print(f"rank {rank} exits {args.fail_code} at step {step}", flush=True)
                sys.stdout.flush()
                os._exit(args.fail_code)
            raise RuntimeError(f"bad hyperparameters at step {step}")
        if first and rank == 0 and step == args.hang_at:
            print(f"rank 0 stuck at step {step}", flush=True)
            time.sleep(3600)
        t0 = time.perf_counter()
        if rank == args.slow_rank and step >= args.slow_from:
            if step == args.slow_from:
                injected("slow rank", step)
            time.sleep(args.slow_s)
        x = torch.randn(8, 16)
        target = x @ teacher + 0.5 * torch.randn(8, 4)
        skip = False
        if first and step + 1 == args.loss_spike_at:
            x, skip = x * 30, True
        if first and step + 1 == args.nan_at:
            x[0, 0], skip = float("nan"), True
        out = model(x)
        own = time.perf_counter() - t0  # this rank's own work, before the all-reduce in backward
        loss = (out - target).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        if not skip:
            optim.step()
        step += 1
        time.sleep(args.step_time)
        if writer is not None:
            if rank == 0:
                writer.step(step, loss=float(loss), tokens=step * 8 * 16, step_time_s=own)
            else:
                writer.step(step, step_time_s=own)
            if skip:
                injected("loss spike" if step == args.loss_spike_at else "nan", step)
        if args.megatron_log and rank == 0:
            _megatron_line(step, args.steps, world, (time.perf_counter() - t0) * 1000, float(loss))
            if skip:
                injected("loss spike" if step == args.loss_spike_at else "nan", step)
        if first and rank == 0 and step == args.ckpt_stall_at and writer is not None:
            writer.checkpoint_begin(step, ckpt_root / f"step_{step:06d}")
            injected("checkpoint stall", step)
            print(f"rank 0 stalls in the save of step {step}", flush=True)
            time.sleep(3600)
        if rank == 0:
            _atomic_json(run_dir / "progress.json", {"step": step, "time": time.time(),
                                                     "attempt": attempt})
        if step % args.ckpt_every == 0:
            stall = first and rank == 1 and step == args.torn_at
            path = ckpt_root / f"step_{step:06d}"
            if writer is not None:
                writer.checkpoint_begin(step, path)
            dcp.save({"model": model.state_dict(), "step": torch.tensor(step)},
                     storage_writer=_StallingWriter(str(path), stall))
            if writer is not None:
                writer.checkpoint_end(step, path)
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
