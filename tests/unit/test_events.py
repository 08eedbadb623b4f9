"""The event vocabulary is declared once (b300.events) and the code keeps to it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from b300.events import PAYLOAD, Kind, check_event
from b300.interfaces import NewEvent

ROOT = Path(__file__).resolve().parents[2]
KIND_VALUES = {k.value for k in Kind}


def test_every_kind_declares_its_payload() -> None:
    assert set(PAYLOAD) == set(Kind)


def test_an_unknown_kind_or_payload_key_is_refused() -> None:
    assert check_event("node.drained", {"reason": "x"}) is Kind.NODE_DRAINED
    with pytest.raises(ValueError, match=r"unknown event kind 'node\.drainde'"):
        NewEvent("node.drainde")
    with pytest.raises(ValueError, match=r"does not declare payload key\(s\) \['reasn'\]"):
        NewEvent(Kind.NODE_DRAINED, data={"reasn": "typo"})


def test_no_module_spells_an_event_kind() -> None:
    """Readers and writers take kinds from b300.events. (Log lines reuse some names as
    their event text, which is fine: they go to structlog, not the store.)"""
    spelled = {}
    for path in sorted([*(ROOT / "daemon").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]):
        if path.name == "events.py" and path.parent.name == "daemon":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        logged = {id(arg) for call in ast.walk(tree) if isinstance(call, ast.Call)
                  and isinstance(call.func, ast.Attribute)
                  and call.func.attr in ("debug", "info", "warning", "error", "exception")
                  for arg in call.args[:1]}
        hits = [(n.lineno, n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n.value in KIND_VALUES and id(n) not in logged]
        if hits:
            spelled[str(path.relative_to(ROOT))] = hits
    assert spelled == {}
