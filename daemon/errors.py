"""The errors the daemon and b300ctl raise on purpose.

Every one of them carries a one-line message meant for a person; the CLI
prints it and exits with the error's ``exit_code`` instead of a traceback.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped (``\\n``,
    ``\\x85``), so a name from outside can neither split a message nor forge a log line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class B300Error(Exception):
    """Base of every error that ends in a one-line message."""

    exit_code = 1

    def __str__(self) -> str:
        return one_line(super().__str__())


class UsageError(B300Error):
    """Wrong input from a person: bad spec, bad config, bad argument, unknown id."""

    exit_code = 2


class SpecError(UsageError):
    """A job spec that cannot be used."""


class ConfigError(UsageError):
    """A daemon configuration that cannot be used."""


class AccessError(UsageError):
    """A file, folder or socket this user may not read or use (the message says which
    access is missing and where)."""


class NotFoundError(UsageError):
    """A run, attempt or node id that is not known."""


class SlurmError(B300Error):
    """A Slurm command or RPC failed.

    ``transient`` is true when trying again later may work (controller down,
    timeouts); false when the request itself was refused (bad partition...).
    """

    exit_code = 3

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class StoreError(B300Error):
    """The state store cannot be reached or used."""

    exit_code = 4


class DaemonUnavailableError(B300Error):
    """b300ctl could not reach the running daemon's control socket."""

    exit_code = 5


class TransferError(B300Error):
    """Copying from a replication target failed: the target was unreachable, a file could
    not be read, or what arrived does not match its manifest."""

    exit_code = 6
