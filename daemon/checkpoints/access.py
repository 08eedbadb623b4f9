"""Can the daemon look after a run's checkpoint folder? (manifests, prune renames and deletes)

Under its systemd unit (``ProtectSystem=strict``) the daemon writes only where the
unit's ``ReadWritePaths`` allow: ``deploy/install.sh`` lists the ``[checkpoints]
roots`` there. A spec whose checkpoint folder is outside the roots, or that the
daemon cannot write, is refused at submit, in one line, rather than failing every
manifest and prune later.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def checkpoint_dir_problem(ckpt_dir: str, roots: Sequence[str]) -> str | None:
    """Why the daemon cannot manage checkpoints in ``ckpt_dir``, or None.

    ``roots`` empty means no restriction by place. The folder itself may not exist
    yet (the job makes it): its nearest existing parent must then be writable.
    """
    path = os.path.normpath(ckpt_dir)
    if roots and not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
        return (f"checkpoint dir {path} is outside [checkpoints] roots ({', '.join(roots)}): under its "
                "systemd unit b300d may write only there (add the folder to roots and run "
                "deploy/install.sh again)")
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if os.access(probe, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    why = "read-only file system" if read_only else "permission denied"
    return (f"b300d cannot write checkpoint dir {path} ({probe}: {why}); without it no manifest "
            "and no prune (under systemd: add it to [checkpoints] roots and run deploy/install.sh again)")
