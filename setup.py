"""Package discovery for the ``b300`` import name (everything else is in pyproject.toml).

The import names are not the folder names (``b300`` is ``daemon/``), which
pyproject's ``packages.find`` cannot express; so the packages are found here
under each mapped folder. A folder with Python files but no ``__init__.py`` would
be skipped silently: ``tests/unit/test_packaging.py`` refuses that, and
``tests/install/test_wheel.py`` imports every module from a built wheel.
"""

from setuptools import find_packages, setup

ROOTS = {"b300": "daemon", "b300.plugins": "plugins", "b300.sql": "sql"}


def _packages() -> list[str]:
    found: list[str] = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(package_dir=ROOTS, packages=_packages())
