"""Least privilege at start-up: refuse files that others could have changed.

The daemon drains nodes and deletes checkpoints on the strength of its config
and state. A config file or state directory that a user other than its owner
(or root) can write is a way to make it do that on someone else's behalf, so
b300d refuses to start with one, naming the file and the fix.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ..errors import ConfigError


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


def user_name() -> str:
    """The name of the user this process runs as (its uid when it has none)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def missing_access(path: str, need: str = "read") -> str:
    """Which access this process lacks to ``path``, for a one-line message.

    ``need`` is ``"read"`` (a file's or folder's content) or ``"write"`` (a
    socket to connect to). The first folder on the way that may not be
    searched is named, else ``path`` itself, with its mode and owner so that
    an operator sees what to change: ``no search (x) permission on /var/lib/b300
    (mode 0750, b300:b300)``.
    """
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts)):
        folder = os.sep.join(parts[:i]) or os.sep
        if not os.access(folder, os.X_OK):
            return f"no search (x) permission on {folder} ({_mode_owner(folder)})"
    wanted = os.W_OK if need == "write" else os.R_OK
    if os.path.isdir(path) and need == "read":
        wanted |= os.X_OK
    if not os.access(path, wanted):
        letter = "read and search (rx)" if wanted == os.R_OK | os.X_OK else f"{need} ({need[0]})"
        return f"no {letter} permission on {path} ({_mode_owner(path)})"
    return f"no {need} permission on {path}"


def _mode_owner(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        return exc.strerror or "cannot stat"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"mode {stat.S_IMODE(st.st_mode):04o}, {owner}:{group}"


def unreadable(path: str, what: str, need: str = "read") -> str:
    """One line: ``<what> <path> is not readable by user alice: <missing access>``."""
    verb = "usable" if need == "write" else "readable"
    return f"{what} {path} is not {verb} by user {user_name()}: {missing_access(path, need)}"
