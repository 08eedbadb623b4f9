"""Slurm clients. :func:`make_slurm_client` picks the backend the config names.

Backends are plugins (entry-point group ``b300.slurm_backends``: ``cli`` and ``pyslurm``
built in), loaded by :class:`b300.plugin_registry.PluginRegistry`; ``auto`` is not a
plugin but the choice between the two built-ins, made here.
"""

from __future__ import annotations

import structlog

from ..errors import ConfigError
from ..interfaces import SlurmClient
from ..plugin_registry import SLURM_BACKENDS, PluginRegistry

log = structlog.get_logger(__name__)


def make_slurm_client(
    backend: str, *, slurm_conf: str | None, bin_dir: str | None, timeout: float, plugins: PluginRegistry
) -> SlurmClient:
    """``cli`` (the default), ``pyslurm``, ``auto``, or another installed backend plugin.

    ``auto`` takes pyslurm only when it imports in a worker process and was
    built for the Slurm release the controller runs (pyslurm builds against
    exactly one release); otherwise cli. The choice and why are logged. The
    pyslurm backend gets the cli client as its fallback; any other backend is
    called with ``slurm_conf``, ``bin_dir`` and ``timeout``. A backend that is not
    installed or did not load is a ConfigError naming it (and why, or which are).
    """
    if backend not in ("auto", "pyslurm"):
        return plugins.get(SLURM_BACKENDS, backend)(slurm_conf=slurm_conf, bin_dir=bin_dir, timeout=timeout)
    cli = plugins.get(SLURM_BACKENDS, "cli")(slurm_conf=slurm_conf, bin_dir=bin_dir, timeout=timeout)
    loaded = plugins.load(SLURM_BACKENDS)
    if "pyslurm" in loaded.plugins:
        from .pyslurm_backend import pyslurm_available

        why_not = pyslurm_available(slurm_conf)
    else:
        why_not = f"the pyslurm backend plugin did not load: {loaded.skipped.get('pyslurm', 'not installed')}"
    if why_not is None:
        log.info("slurm.backend", backend="pyslurm", configured=backend,
                 why="pyslurm is built for the Slurm release the controller runs")
        return loaded.plugins["pyslurm"](slurm_conf=slurm_conf, timeout=timeout, fallback=cli)
    if backend == "pyslurm":
        raise ConfigError(f"slurm.backend is pyslurm but {why_not}")
    log.info("slurm.backend", backend="cli", configured=backend, why=why_not)
    return cli
