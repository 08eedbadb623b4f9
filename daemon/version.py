"""What ``b300d --version`` and ``b300ctl --version`` print: the package version and the
state store's schema head. Needs no config, no Slurm and no database."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from .store.schema_revision import SCHEMA_HEADS

DISTRIBUTION = "b300-orchestrator"


def package_version() -> str:
    """The installed distribution's version; from a source tree that was never installed,
    the ``version`` of its ``pyproject.toml``; ``"unknown"`` when neither is there."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return "unknown"
    version = project.get("version") if isinstance(project, dict) else None
    return version if isinstance(version, str) and version else "unknown"


def version_text(program: str) -> str:
    """Two lines: ``<program> <version>`` and the schema head revision(s) it migrates to."""
    return f"{program} {package_version()}\nstate store schema {','.join(sorted(SCHEMA_HEADS))}"
