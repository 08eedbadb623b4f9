"""The state store's URL with its password, from ``[daemon] database_password_file``.

The config is readable by the admin group; the PostgreSQL password lives in a
file of its own, read when the store is opened (by b300d at start, by b300ctl
for its queries), so the URL in the config carries none.
"""

from __future__ import annotations

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from ..errors import AccessError, ConfigError
from ..safety.permissions import check_secret_file, unreadable

_WHAT = "[daemon] database_password_file"
_MAX_PASSWORD_BYTES = 4096


def read_password_file(path: str, *, reader: bool) -> str:
    """The password in ``path``, without one trailing newline.

    ``reader`` (b300ctl): a file this user may not read is an AccessError that
    says what to do; for the daemon (``reader=False``) the file must also not be
    readable by others (:func:`b300.safety.permissions.check_secret_file`). A missing or
    empty file is a ConfigError. Every message is one line naming the file.
    """
    if not reader:
        check_secret_file(path, _WHAT)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_PASSWORD_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{_WHAT} {path}: not found") from None
    except PermissionError:
        if reader:
            raise AccessError(
                unreadable(path, "the state store's password file")
                + "; the documented install gives the admin group read on it"
                " (ask to join that group), or use `b300ctl status`, which asks the running daemon"
            ) from None
        raise AccessError(unreadable(path, _WHAT)) from None
    except OSError as exc:
        raise ConfigError(f"{_WHAT} {path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > _MAX_PASSWORD_BYTES:
        raise ConfigError(f"{_WHAT} {path}: longer than {_MAX_PASSWORD_BYTES} bytes, not a password")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{_WHAT} {path}: not UTF-8 text") from None
    password = text[:-1] if text.endswith("\n") else text
    if not password:
        raise ConfigError(f"{_WHAT} {path} is empty")
    return password


def store_url(url: str, password_file: str, *, reader: bool) -> str:
    """``url`` with the password of ``password_file`` (``url`` itself when there is no file).

    The config refuses a URL that carries a password as well as a password file.
    """
    if not password_file:
        return url
    password = read_password_file(password_file, reader=reader)
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError:
        raise ConfigError("state store URL is not a valid database URL") from None
    return parsed.set(password=password).render_as_string(hide_password=False)
