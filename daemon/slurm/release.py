"""Which Slurm release the daemon talks to, and the oldest one it accepts.

``sinfo -V`` prints ``slurm-wlm 24.11.5`` on Debian's builds and ``slurm 24.11.5``
on SchedMD's; the daemon reads it once at start, logs it, records it in the state
directory for ``b300ctl status`` and refuses a release older than the oldest one its
tests run against (22.05, see docs/install.md, "Supported Slurm releases").
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..errors import SlurmError

OLDEST = (22, 5)
RELEASE_FILE = "slurm.json"
_VERSION_RE = re.compile(r"slurm(?:-wlm)?\s+(\d{1,3})\.(\d{1,2})\.(\d{1,3})([0-9A-Za-z.~+-]*)")


@dataclass(frozen=True)
class SlurmRelease:
    """A parsed ``sinfo -V``: ``text`` is the version as printed (``24.11.5``)."""

    major: int
    minor: int
    micro: int
    text: str

    @property
    def release(self) -> str:
        """``24.11``: the release (SchedMD's unit of support)."""
        return f"{self.major:02d}.{self.minor:02d}"


def parse_release(stdout: str) -> SlurmRelease:
    """``slurm-wlm 24.11.5`` -> SlurmRelease(24, 11, 5); anything else raises ValueError."""
    for line in stdout.splitlines():
        m = _VERSION_RE.fullmatch(line.strip())
        if m:
            major, minor, micro = (int(m.group(i)) for i in (1, 2, 3))
            return SlurmRelease(major, minor, micro, f"{major}.{minor:02d}.{micro}{m.group(4)}")
    raise ValueError(f"not a Slurm version line: {stdout.strip()[:100]!r}")


def check_release(release: SlurmRelease) -> None:
    """Refuse (SlurmError, exit 3) a release older than :data:`OLDEST`."""
    if (release.major, release.minor) < OLDEST:
        raise SlurmError(
            f"Slurm {release.text} is older than {OLDEST[0]}.{OLDEST[1]:02d}, the oldest release "
            "b300d is tested against; upgrade Slurm or run an older b300d", transient=False)


def record_release(state_dir: str | Path, release: SlurmRelease | None, backend: str,
                   now: datetime) -> None:
    """Write ``state_dir/slurm.json`` (what b300ctl status shows) atomically."""
    path = Path(state_dir) / RELEASE_FILE
    tmp = path.with_name(f".{RELEASE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({
        "version": release.text if release else None,
        "release": release.release if release else None,
        "backend": backend,
        "checked_at": now.isoformat(),
    }) + "\n")
    os.replace(tmp, path)


def read_release(state_dir: str | Path) -> dict[str, object] | None:
    """What the daemon recorded at its last start, or None."""
    try:
        data = json.loads((Path(state_dir) / RELEASE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
