"""The built wheel, installed NON-editable into a fresh venv, holds every module
of the source tree (issue 11: ``pip install .`` left out ``b300.recovery`` and
every command died with ModuleNotFoundError; the editable install hid it).

The wheel is built from a copy of the sources (the checkout stays clean) with
``pip wheel --no-deps``, installed with ``--no-deps`` into a new venv; the
dependencies come from this interpreter's site-packages through a ``.pth``
file (plain path lines: no editable finder of this checkout is loaded), so the
test needs no download. ``deploy/install.sh``'s test installs with dependencies.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"daemon": "b300", "plugins": "b300.plugins", "sql": "b300.sql"}
# Alembic runs env.py by path inside a migration; it is not importable on its own.
# The check below runs the migrations from the installed package, which loads it.
NOT_IMPORTABLE = {"b300.sql.env"}


def source_modules() -> list[str]:
    """Every module of the source tree, by its installed name."""
    names = []
    for folder, package in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join([package, *parts]))
    return names


_CHECK = r"""
import importlib, importlib.metadata as md, json, sys, tempfile
prefix, modules = sys.argv[1], json.loads(sys.argv[2])
bad = {}
for name in modules:
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        bad[name] = f"{type(exc).__name__}: {exc}"
        continue
    if not (mod.__file__ or "").startswith(prefix):
        bad[name] = f"imported from {mod.__file__}, not the wheel"
eps = [ep for ep in md.distribution("b300-orchestrator").entry_points if ep.group.startswith("b300.")]
for ep in eps:
    try:
        ep.load()
    except Exception as exc:
        bad[f"entry point {ep.group}:{ep.name}"] = f"{type(exc).__name__}: {exc}"
from b300.store import open_store
with tempfile.TemporaryDirectory() as tmp:
    open_store(f"sqlite:///{tmp}/state.db").close()   # alembic.ini, env.py, versions/
print(json.dumps({"bad": bad, "entry_points": len(eps)}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in ROOTS:
        shutil.copytree(REPO / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "--disable-pip-version-check", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("b300_orchestrator-*.whl")
    return built


def test_wheel_lists_every_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for module in source_modules():
        path = module.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__init__.py" in names, module
    assert {"b300/sql/alembic.ini", "b300/sql/script.py.mako"} <= set(names)


def test_every_module_imports_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--quiet",
                           "--disable-pip-version-check", str(wheel)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "zz_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))

    modules = [m for m in source_modules() if m not in NOT_IMPORTABLE]
    assert "b300.recovery.recoverer" in modules
    proc = subprocess.run([str(py), "-I", "-c", _CHECK, purelib, json.dumps(modules)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bad"] == {}
    assert result["entry_points"] >= 19
    for script in ("b300ctl", "b300d"):
        run = subprocess.run([str(venv / "bin" / script), "--help"], capture_output=True,
                             text=True, timeout=120, check=False)
        assert run.returncode == 0 and "usage" in run.stdout, (script, run.stderr[-2000:])
