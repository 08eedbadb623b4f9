"""deploy/examples/b300.toml loads, and documents every [recovery] key (issue 11:
the section was missing; its keys were documented only in code)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from b300.config import RecoveryConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "b300.toml"


def test_example_config_loads() -> None:
    load_config(str(EXAMPLE))


def test_example_documents_every_recovery_key() -> None:
    table = tomllib.loads(EXAMPLE.read_text())["recovery"]
    keys = {f.name.removesuffix("_s") for f in dataclasses.fields(RecoveryConfig)}
    assert keys == set(table)
    assert load_config(str(EXAMPLE)).recovery == RecoveryConfig()  # the example shows the defaults
