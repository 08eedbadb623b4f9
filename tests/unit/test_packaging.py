"""Every folder of the package is a package: setuptools' find skips one without
``__init__.py`` silently, and the installed wheel then lacks it (issue 11: the
wheel had no ``b300.recovery``)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("daemon", "plugins", "sql")


def test_every_folder_with_python_files_has_an_init() -> None:
    folders = {p.parent for root in ROOTS for p in (REPO / root).rglob("*.py")
               if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file())
    assert len(folders) >= 9
    assert missing == [], f"folders without __init__.py (left out of the wheel): {missing}"


def test_no_package_list_kept_by_hand() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert "packages = [" not in text, "pyproject lists packages by hand; setup.py finds them"
