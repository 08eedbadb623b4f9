"""Real third-party distributions for the plugin tests: a ``*.dist-info`` folder with
``METADATA`` and ``entry_points.txt`` next to the plugin modules, in a folder put first
on ``sys.path``, found by ``importlib.metadata`` exactly as an installed package is.

Test modules import the fixture (``from third_party import site_fixture  # noqa: F401``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest


class Site:
    """A folder on ``sys.path`` that tests install distributions into."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: set[str] = set()

    def install(self, dist: str, modules: Mapping[str, str],
                entry_points: Mapping[str, Mapping[str, str]]) -> None:
        """``dist`` with ``modules`` (name -> source) and ``entry_points`` (group -> name -> value)."""
        for name, source in modules.items():
            (self.root / f"{name}.py").write_text(source)
            self.modules.add(name)
        info = self.root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items())
            for group, eps in entry_points.items()))
        importlib.invalidate_caches()


@pytest.fixture(name="site")
def site_fixture(tmp_path: Path) -> Iterator[Site]:
    root = tmp_path / "site-packages"
    root.mkdir()
    site = Site(root)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield site
    finally:
        sys.path.remove(str(root))
        for name in site.modules:
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
