"""Run b300ctl's own code as another user (``nobody``, an admin-group member) from any clone.

The checkout may sit where that user cannot read (a clone under /root, mode 0700),
and so may the interpreter and its libraries (pyenv under /root here). So the
package is copied once into a world-readable folder under /var/tmp (``b300`` from
``daemon/``, with ``plugins/`` and ``sql/`` inside it, as the wheel lays it out) and
put first on ``sys.path``; the process starts as root, imports what the commands
import from the libraries (which that user may not be able to read), drops to the
user for good (groups, gid, uid), then runs :func:`b300.cli.main`. b300's own
modules that load lazily come from the copy, readable by anyone.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from helpers import REPO

# Library modules b300ctl's commands import lazily (the libraries may be out of the
# user's reach once the uid is dropped): b300's own come from the readable copy.
_PRELOAD = ("b300.cli", "b300.config", "b300.config.tables", "b300.control.client", "b300.spec",
            "b300.checkpoints.retention", "b300.checkpoints.policy", "b300.store",
            "b300.store.credentials", "b300.control.status_view", "sqlalchemy.dialects.sqlite.pysqlite",
            "sqlalchemy.dialects.postgresql.psycopg", "psycopg", "concurrent.futures.thread",
            "concurrent.futures.process", "encodings.idna", "encodings.ascii", "pydantic_core")


@cache
def package_copy() -> Path:
    """A folder readable by every user holding the package ``b300`` of this checkout."""
    top = Path(tempfile.mkdtemp(prefix="b300-asuser-", dir="/var/tmp"))
    atexit.register(shutil.rmtree, top, True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "daemon", top / "b300", ignore=skip)
    shutil.copytree(REPO / "plugins", top / "b300" / "plugins", ignore=skip)
    shutil.copytree(REPO / "sql", top / "b300" / "sql", ignore=skip)
    for folder, _dirs, files in os.walk(top):
        os.chmod(folder, 0o755)  # noqa: S103 - the other user must read it: the point here
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return top


def ctl_as(uid: int, gid: int, groups: tuple[int, ...], *argv: str,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``b300ctl ARGV`` as uid/gid with these supplementary groups, from the readable copy."""
    code = ("import importlib, os, pkgutil, sys, warnings\n"
            f"sys.path.insert(0, {str(package_copy())!r})\n"
            f"for name in {_PRELOAD!r}:\n    importlib.import_module(name)\n"
            # Every b300 module once, for the libraries it imports (b300's own are readable).
            "import b300\n"
            "for info in pkgutil.walk_packages(b300.__path__, 'b300.'):\n"
            "    try:\n        importlib.import_module(info.name)\n"
            "    except Exception:\n        pass\n"
            # pydantic builds validators on first use and imports its parts then.
            "import pydantic\n"
            "for info in pkgutil.walk_packages(pydantic.__path__, 'pydantic.'):\n"
            "    if '.v1' not in info.name and 'mypy' not in info.name:\n"
            "        try:\n            importlib.import_module(info.name)\n"
            "        except Exception:\n            pass\n"
            "warnings.resetwarnings()\n"
            f"assert __import__('b300').__file__.startswith({str(package_copy())!r})\n"
            f"os.setgroups({list(groups)!r}); os.setgid({gid}); os.setuid({uid})\n"
            f"assert os.getuid() == os.geteuid() == {uid}\n"
            "import b300.cli\nsys.exit(b300.cli.main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd="/", env={**os.environ, "HOME": "/"})
