"""Writers of checkpoint directories as the frameworks lay them out, for the tests."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SshServer:
    port: int
    username: str
    key_filename: str
    known_hosts: str
    base: Path


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str


def write_file(path: Path, data: bytes = b"x" * 64, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def dcp(root: Path, name: str, *, ranks: int = 2, metadata: bool = True, t: float = 1_700_000_000.0) -> Path:
    d = root / name
    for r in range(ranks):
        write_file(d / f"__{r}_0.distcp", os.urandom(256) , mtime=t)
    if metadata:
        write_file(d / ".metadata", b"meta" * 8, mtime=t + 1)
    return d


def generic(root: Path, step: int, *, done: bool = True, t: float = 1_700_000_000.0) -> Path:
    d = root / f"step_{step}"
    write_file(d / "model.pt", os.urandom(512), mtime=t)
    write_file(d / "opt" / "state.pt", os.urandom(128), mtime=t)
    if done:
        write_file(d / "DONE", b"", mtime=t + 1)
    return d


def megatron(root: Path, steps: list[int], latest: int | None) -> None:
    for s in steps:
        write_file(root / f"iter_{s:07d}" / "mp_rank_00" / "model_optim_rng.pt", os.urandom(300))
    if latest is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(f"{latest}\n")


def deepspeed(root: Path, steps: list[int], latest: int | None) -> None:
    for s in steps:
        write_file(root / f"global_step{s}" / "mp_rank_00_model_states.pt", os.urandom(300))
        write_file(root / f"global_step{s}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", os.urandom(300))
    if latest is not None:
        (root / "latest").write_text(f"global_step{latest}")
