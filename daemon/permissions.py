"""Least privilege at start-up: refuse files that others could have changed.

The daemon drains nodes and deletes checkpoints on the strength of its config
and state. A config file or state directory that a user other than its owner
(or root) can write is a way to make it do that on someone else's behalf, so
b300d refuses to start with one, naming the file and the fix.
"""

from __future__ import annotations

import os
import stat

from .errors import ConfigError


def check_secret_file(path: str, what: str) -> None:
    """Raise ConfigError unless ``path`` is readable by its owner (and group) only.

    A secret that every user on the login node can read is no secret; one that
    others can write could be swapped for theirs.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror or exc}") from None
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise ConfigError(f"{what} {path} is readable or writable by others (mode {mode:04o}); "
                          f"run: chmod 600 {path}")


def check_not_writable_by_others(path: str, what: str) -> None:
    """Raise ConfigError if ``path`` is group/world-writable or owned by another user.

    A missing path is fine (it is created later with safe modes). Sticky
    shared directories such as /tmp are not allowed as the path itself.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot check permissions: {exc.strerror}") from None
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{what} {path} is writable by group or others (mode {mode:04o}); "
            f"run: chmod go-w {path}")
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError(f"{what} {path} is owned by uid {st.st_uid}, not by root or the "
                          f"daemon's user (uid {os.geteuid()})")
