"""``[daemon] mode`` and the switches that hold actions back: what a config allows the
daemon to do of its own accord (b300.safety.mode), and the record of what it held back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from b300.config import load_config
from b300.config.action_policy import action_policy
from b300.errors import ConfigError
from b300.events import Kind
from b300.interfaces import NewEvent
from b300.safety.mode import Withheld

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _cfg(tmp_path: Path, text: str = ""):  # type: ignore[no-untyped-def]
    p = tmp_path / "b300.toml"
    p.write_text("[daemon]\nstate_dir = '/srv/b300'\n" + text)
    return load_config(str(p))


def test_a_config_that_says_nothing_observes(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert cfg.mode == "observe"
    p = action_policy(cfg)
    assert not p.acting and not p.nodes_and_runs and not p.signals and not p.deletes
    assert 'mode = "observe"' in p.why


def test_act_allows_what_each_switch_allows(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "mode = 'act'\n")
    p = action_policy(cfg)
    assert p.nodes_and_runs and p.signals and not p.deletes and not p.reservations and p.why == ""
    off = action_policy(_cfg(tmp_path, "mode = 'act'\n[recovery]\nenabled = false\n"
                                       "[checkpoints]\nallow_signals = false\nprune = true\n"))
    assert not off.nodes_and_runs and not off.signals and off.deletes
    assert off.why == "[recovery] enabled = false"


def test_a_wrong_mode_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, "mode = 'enforce'\n")
    assert "mode" in str(err.value) and "observe" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("text", "local", "remote"), [
    ("", False, False),                                   # nothing deleted anywhere
    ("prune = true\n", True, True),                       # remote follows local
    ("prune = true\nprune_remote = false\n", True, False),
    ("prune_remote = true\n", False, True),               # asked for in words
])
def test_prune_remote_follows_prune(tmp_path: Path, text: str, local: bool, remote: bool) -> None:
    c = _cfg(tmp_path, "[checkpoints]\n" + text).checkpoints
    assert (c.prune, c.prunes_remote) == (local, remote)


def test_withheld_records_each_action_once() -> None:
    written: list[NewEvent] = []
    w = Withheld(lambda events, now: written.extend(events), "because")
    for _ in range(3):
        w("drain", "gpu01", NOW, node="gpu01", detail="nccl 2.21.5")
    w("drain", "gpu02", NOW, node="gpu02")
    w("delete", "/ckpt/step_1", NOW, run_id="r1", why="[checkpoints] prune = false (plan only)")
    assert [(e.kind, e.node, e.data["subject"], e.data["why"]) for e in written] == [
        (Kind.ACTION_WITHHELD, "gpu01", "gpu01", "because"),
        (Kind.ACTION_WITHHELD, "gpu02", "gpu02", "because"),
        (Kind.ACTION_WITHHELD, None, "/ckpt/step_1", "[checkpoints] prune = false (plan only)")]


def test_withheld_retries_when_the_store_is_down() -> None:
    calls: list[int] = []

    def append(events: list[NewEvent], now: datetime) -> None:
        calls.append(len(events))
        if len(calls) == 1:
            raise OSError("database is locked")

    w = Withheld(append, "because")
    w("cancel", "job 7", NOW)
    w("cancel", "job 7", NOW)  # the first was not recorded: recorded now
    w("cancel", "job 7", NOW)
    assert calls == [1, 1]
