"""A light data-parallel "training" job for the demo: Python standard library only.

Run under Slurm with one task per node: ``srun python3 light_train.py --steps 200``.
Rank and world size come from ``SLURM_PROCID``/``SLURM_NTASKS``. Rank 0 listens on its
node; the other ranks find it at the ``NodeAddr`` Slurm holds for the job's first node
(``scontrol show node -o``), so it works on a real cluster, on the local cluster at
127.0.0.1 and in its network-namespace mode. Every step each rank sends a small vector
(its "gradient") to rank 0, which averages them and sends the mean back: an all-reduce.
Every socket operation has a timeout (``--timeout``): a peer that dies or goes silent
fails the step and the job exits 1, as NCCL/gloo would.

Checkpoints (the ``generic`` layout): every ``--ckpt-every`` steps rank 0 writes
``$B300_CHECKPOINT_DIR/step_<N>/state.json`` then ``DONE``, in a hidden folder renamed
into place, so a listed ``step_<N>`` is always whole. At start it resumes from
``$B300_RESUME_FROM``, else from the newest ``step_<N>`` holding ``DONE``. Rank 0 reports
progress to ``$B300_PROGRESS_FILE`` every step (docs/design/progress.md): a path ending in
``.jsonl`` gets protocol v1 lines appended (with ``ckpt_begin``/``ckpt_end`` around each
save), any other path the snapshot form, ``{"step": N, "time": T, "loss": L}`` replaced
whole, which every reader of the daemon takes (hang detection and drills included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

_DIM = 8


def _node_addr(node: str) -> str:
    """The address Slurm holds for ``node`` (its NodeAddr), else the name itself."""
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m.group(1) if m else node


def _first_node() -> str:
    out = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return out.split()[0]


def _port() -> int:
    # Several local clusters reuse job ids: the cluster's name keeps their ports apart.
    job = int(os.environ.get("SLURM_JOB_ID", "0"))
    step = int(os.environ.get("SLURM_STEP_ID", "0") or 0)
    return 31000 + (job + 7919 * step + zlib.crc32(os.environ.get("SLURM_CLUSTER_NAME", "").encode())) % 20000


def _send(sock: socket.socket, obj: object) -> None:
    sock.sendall((json.dumps(obj) + "\n").encode())


def _recv(f: object) -> list[float]:
    line = f.readline()  # type: ignore[attr-defined]
    if not line:
        raise ConnectionError("peer closed the connection")
    return [float(x) for x in json.loads(line)]


def _newest_checkpoint(root: Path) -> Path | None:
    found = [(int(p.name[5:]), p) for p in root.glob("step_*")
             if p.name[5:].isdigit() and (p / "DONE").exists()]
    return max(found)[1] if found else None


def _save(root: Path, step: int, weights: list[float]) -> Path:
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "state.json").write_text(json.dumps({"step": step, "weights": weights}))
    (tmp / "DONE").write_text(f"{step}\n")
    os.replace(tmp, final)
    return final


class _Progress:
    """Progress protocol v1 lines, one ``write()`` each on an O_APPEND descriptor (a
    ``.jsonl`` path), else a snapshot of the last step line replaced whole."""

    def __init__(self, pattern: str, rank: int, host: str) -> None:
        self._path = pattern.replace("{host}", host).replace("{rank}", str(rank)) if pattern else ""
        self._base = {"v": 1, "host": host, "rank": rank}

    def line(self, **fields: object) -> None:
        if not self._path:
            return
        if not self._path.endswith(".jsonl"):
            if "event" not in fields:
                tmp = f"{self._path}.tmp"
                with open(tmp, "w") as f:
                    json.dump({"time": time.time(), **fields}, f)
                os.replace(tmp, self._path)
            return
        data = json.dumps({**self._base, "time": time.time(), **fields}) + "\n"
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)


def _connect_peers(rank: int, world: int, addr: str, port: int, timeout: float) -> list[socket.socket]:
    """Rank 0: the other ranks' connections, in rank order; others: [the one to rank 0]."""
    deadline = time.monotonic() + 120
    if rank == 0:
        srv = socket.create_server(("", port), reuse_port=False)
        srv.settimeout(120)
        peers: dict[int, socket.socket] = {}
        while len(peers) < world - 1:
            conn, _ = srv.accept()
            conn.settimeout(timeout)
            peers[int(conn.makefile().readline())] = conn
        srv.close()
        return [peers[r] for r in sorted(peers)]
    while True:  # rank 0 may not listen yet: retry, bounded
        try:
            sock = socket.create_connection((addr, port), timeout=timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    sock.settimeout(timeout)
    _send(sock, rank)
    return [sock]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--step-time", type=float, default=0.5)
    ap.add_argument("--timeout", type=float, default=15.0, help="seconds a peer may stay silent")
    args = ap.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    host = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    ckpt_root = Path(os.environ.get("B300_CHECKPOINT_DIR", "ckpt"))
    progress = _Progress(os.environ.get("B300_PROGRESS_FILE", "") if rank == 0 else "", rank, host)

    weights, start = [0.0] * _DIM, 0
    resume = os.environ.get("B300_RESUME_FROM", "")
    src = Path(resume) if resume and (Path(resume) / "DONE").exists() else _newest_checkpoint(ckpt_root)
    if src is not None:
        state = json.loads((src / "state.json").read_text())
        weights, start = [float(w) for w in state["weights"]], int(state["step"])
    addr = _node_addr(_first_node())
    print(f"rank {rank}/{world} on {host}: rank 0 at {addr}:{_port()}, from step {start}", flush=True)
    try:
        peers = _connect_peers(rank, world, addr, _port(), args.timeout)
        files = [p.makefile("r") for p in peers]
        for step in range(start + 1, args.steps + 1):
            t0 = time.monotonic()
            time.sleep(args.step_time)  # the work of a step
            grad = [((step * 31 + rank * 7 + i) % 11 - 5) / 100.0 - 0.01 * w for i, w in enumerate(weights)]
            work_s = time.monotonic() - t0
            if rank == 0:
                total = grad[:]
                for f in files:
                    total = [a + b for a, b in zip(total, _recv(f), strict=True)]
                mean = [x / world for x in total]
                for p in peers:
                    _send(p, mean)
            else:
                _send(peers[0], grad)
                mean = _recv(files[0])
            weights = [w + g for w, g in zip(weights, mean, strict=True)]
            loss = sum(w * w for w in weights) / _DIM + 0.25
            progress.line(step=step, loss=loss, samples=step * 8 * world, step_time_s=round(work_s, 4))
            if rank == 0 and step % args.ckpt_every == 0:
                path = str(ckpt_root / f"step_{step:06d}")
                progress.line(step=step, event="ckpt_begin", path=path)
                _save(ckpt_root, step, weights)
                progress.line(step=step, event="ckpt_end", path=path)
    except (OSError, ValueError) as e:  # a dead or silent peer; socket.timeout is an OSError
        print(f"rank {rank} on {host}: the step failed: {e!r}", file=sys.stderr, flush=True)
        return 1
    print(f"rank {rank} on {host}: done at step {args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
