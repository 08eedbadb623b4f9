"""The generated reference under ``docs/reference/``: config keys, event kinds, metrics.

``python -m b300.docs_reference --write`` writes the files; ``--check`` exits 1 with one
line naming the first file that differs from what the code generates (0 when all are
current). The text is a pure function of the code: no time, host or path in it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

BANNER = ("<!-- Generated from the code by `python -m b300.docs_reference --write`; "
          "do not edit by hand. -->\n\n")


def _config() -> str:
    from .config_ref import config_sections, render_config

    return render_config(config_sections())


def _events() -> str:
    from .catalog import render_events

    return render_events()


def _metrics() -> str:
    from .catalog import render_metrics

    return render_metrics()


#: Each file under ``docs/reference/`` and what writes it.
FILES: dict[str, Callable[[], str]] = {"config.md": _config, "events.md": _events, "metrics.md": _metrics}


def default_dir() -> Path:
    """``docs/reference`` of the checkout this package sits in."""
    return Path(__file__).resolve().parents[2] / "docs" / "reference"


def generate() -> dict[str, str]:
    """File name -> its complete text."""
    return {name: BANNER + make().rstrip("\n") + "\n" for name, make in FILES.items()}


def stale(directory: Path) -> list[str]:
    """The files under ``directory`` that are missing or differ from :func:`generate`."""
    out = []
    for name, text in generate().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m b300.docs_reference",
                                     description="Generate docs/reference/ from the code.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the files")
    mode.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--dir", type=Path, default=None, help="the reference folder (default: docs/reference)")
    args = parser.parse_args(argv)
    directory: Path = args.dir or default_dir()
    if args.check:
        if bad := stale(directory):
            print(f"{directory / bad[0]} is stale: run python -m b300.docs_reference --write", file=sys.stderr)
            return 1
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in generate().items():
        (directory / name).write_text(text, encoding="utf-8")
    return 0
