"""docs/reference/ is what the code generates (b300.docs_reference), never stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from b300 import docs_reference
from b300.config.tables import ConfigFile
from b300.events import Kind

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def test_committed_reference_is_what_the_code_generates() -> None:
    generated = docs_reference.generate()
    for name, text in generated.items():
        committed = (REFERENCE / name).read_text(encoding="utf-8")
        assert committed == text, f"docs/reference/{name} is stale: run python -m b300.docs_reference --write"


def test_check_names_the_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert docs_reference.main(["--write", "--dir", str(tmp_path)]) == 0
    assert docs_reference.main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "events.md").write_text("old\n", encoding="utf-8")
    assert docs_reference.main(["--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "events.md" in err[0]


def test_every_section_kind_and_metric_is_listed() -> None:
    text = docs_reference.generate()
    for section in ConfigFile.model_fields:
        assert f"## `[{section}]`" in text["config.md"]
    for kind in Kind:
        assert f"| `{kind.value}` |" in text["events.md"]
    assert "| `b300_spare_pool_nodes` |" in text["metrics.md"]
    assert "| `b300_cycle_duration_seconds` |" in text["metrics.md"]


def _reload_of(config_md: str, section: str, key: str) -> str:
    """The reload column of ``key`` in the table under ``## `section` `` (``[daemon]``, ``[[spares.pool]]``)."""
    body = config_md.split(f"## `{section}`\n", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in body.splitlines() if line.startswith(f"| `{key}` |"))
    return row.split("|")[5].strip()


def test_reload_column_follows_the_reloader() -> None:
    """The verdicts come from plan_reload: what it applies live, and what needs a restart
    (recovery.enabled does, while the other [recovery] keys are live)."""
    config = docs_reference.generate()["config.md"]
    assert _reload_of(config, "[daemon]", "poll_interval") == "live"
    assert _reload_of(config, "[daemon]", "state_dir") == "restart"
    assert _reload_of(config, "[recovery]", "enabled") == "restart"
    assert _reload_of(config, "[recovery]", "settle") == "live"
    assert _reload_of(config, "[training.loss]", "window") == "live"
    assert _reload_of(config, "[metrics]", "listen") == "restart"
    assert _reload_of(config, "[[spares.pool]]", "nodes") == "live"


def test_every_config_key_is_described() -> None:
    """A key without ``Field(description=...)`` or a ``#:`` comment in its model would be
    an empty cell in the reference: say what it does where it is declared."""
    from b300.docs_reference.config_ref import config_sections

    bare = [".".join(k.path) for s in config_sections() for k in s.keys if not k.description]
    assert not bare, f"config keys without a description (add a #: comment in the model): {bare}"
