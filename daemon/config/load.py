"""Reading the config file: path, bytes, TOML, validated tables, then :class:`Config`."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from ..errors import AccessError, ConfigError
from .settings import Config

DEFAULT_CONFIG = "/etc/b300/b300.toml"


def config_path(explicit: str | None) -> str:
    """The config file to read: ``--config``, else ``$B300_CONFIG``, else the default."""
    return explicit or os.environ.get("B300_CONFIG") or DEFAULT_CONFIG


def load_config(path: str) -> Config:
    """Read and validate the config file; every problem is one ConfigError line naming the
    file, the table and the key (rules: :mod:`b300.config.tables`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except PermissionError:
        from ..safety.permissions import unreadable

        raise AccessError(unreadable(path, "config file")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    # The tables' models are built (pydantic, tens of ms) when first needed, not when
    # b300.config is imported: code that only reads a Config does not pay for them.
    from .tables import config_from_toml

    return config_from_toml(doc, path)
