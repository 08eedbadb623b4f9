"""Slurm clients. :func:`make_slurm_client` picks the backend the config names."""

from __future__ import annotations

import structlog

from ..errors import ConfigError
from ..interfaces import SlurmClient

log = structlog.get_logger(__name__)


def make_slurm_client(
    backend: str, *, slurm_conf: str | None, bin_dir: str | None, timeout: float
) -> SlurmClient:
    """``cli`` (the default), ``pyslurm``, or ``auto``.

    ``auto`` takes pyslurm only when it imports in a worker process and was
    built for the Slurm release the controller runs (pyslurm builds against
    exactly one release); otherwise cli. The choice and why are logged.
    """
    from .cli import CliSlurmClient

    if backend not in ("auto", "cli", "pyslurm"):
        raise ConfigError(f"slurm.backend must be auto, cli or pyslurm, got {backend!r}")
    cli = CliSlurmClient(slurm_conf=slurm_conf, bin_dir=bin_dir, timeout=timeout)
    if backend == "cli":
        return cli
    from .pyslurm_backend import PyslurmClient, pyslurm_available

    why_not = pyslurm_available(slurm_conf)
    if why_not is None:
        log.info("slurm.backend", backend="pyslurm", configured=backend,
                 why="pyslurm is built for the Slurm release the controller runs")
        return PyslurmClient(slurm_conf=slurm_conf, timeout=timeout, fallback=cli)
    if backend == "pyslurm":
        raise ConfigError(f"slurm.backend is pyslurm but {why_not}")
    log.info("slurm.backend", backend="cli", configured=backend, why=why_not)
    return cli
