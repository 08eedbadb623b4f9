"""How every b300ctl command prints: tables, JSON, times and event details, one way."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def print_table(rows: Sequence[Sequence[str]], *, indent: str = "") -> None:
    """``rows`` (the first is usually the header) in columns as wide as their widest
    cell, two spaces apart, without trailing blanks. Nothing for no rows."""
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def print_json(value: Any, *, lines: bool = False) -> None:
    """``value`` as indented JSON; ``lines``: one compact object per line, flushed
    (``events --follow --json``, read by programs as it comes)."""
    if lines:
        print(json.dumps(value), flush=True)
    else:
        print(json.dumps(value, indent=2))


def show(as_json: bool, value: Any, text: Callable[[Any], None]) -> int:
    """Print ``value`` as JSON, or with ``text`` (the command's table); exit code 0."""
    if as_json:
        print_json(value)
    else:
        text(value)
    return 0


def when(iso: str | None, missing: str = "-") -> str:
    """An ISO time as ``2026-11-23 08:00:00`` (seconds, no zone: b300 writes UTC)."""
    return iso[:19].replace("T", " ") if iso else missing


def details(data: Mapping[str, Any]) -> str:
    """An event's payload as ``key=value`` words, leaving out empty values."""
    return " ".join(f"{k}={v}" for k, v in data.items() if v not in (None, "", []))


def node_list(names: Sequence[str]) -> str:
    """Node names folded the way Slurm writes them (``gpu[01-03]``), ``-`` for none."""
    if not names:
        return "-"
    # ClusterShell itself, not b300.slurm.parse.fold_nodes: importing the b300.slurm
    # package loads the backend machinery and its logging, which a table does not need.
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(list(names)))


def size(n: float) -> str:
    """Bytes in binary units (``512 B``, ``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
