"""Slurm clients. :func:`make_slurm_client` picks the backend the config names."""

from __future__ import annotations

import structlog

from ..errors import ConfigError
from ..interfaces import SlurmClient

log = structlog.get_logger(__name__)


def make_slurm_client(
    backend: str, *, slurm_conf: str | None, bin_dir: str | None, timeout: float
) -> SlurmClient:
    """``cli``, ``pyslurm`` or ``auto`` (pyslurm when it imports in a worker, else cli)."""
    from .cli import CliSlurmClient

    if backend not in ("auto", "cli", "pyslurm"):
        raise ConfigError(f"slurm.backend must be auto, cli or pyslurm, got {backend!r}")
    if backend in ("auto", "pyslurm"):
        from .pyslurm_backend import PyslurmClient, pyslurm_available

        why_not = pyslurm_available(slurm_conf)
        if why_not is None:
            return PyslurmClient(slurm_conf=slurm_conf, timeout=timeout)
        if backend == "pyslurm":
            raise ConfigError(f"slurm.backend is pyslurm but {why_not}")
        log.info("slurm.backend_fallback", backend="cli", why=why_not)
    return CliSlurmClient(slurm_conf=slurm_conf, bin_dir=bin_dir, timeout=timeout)
