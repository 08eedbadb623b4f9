"""What a b300ctl command is (:class:`Command`) and what it is given to run (:class:`Context`).

Every command is one :class:`Command` record: its name, help, arguments as data
(:func:`arg`), and ``run(ctx, args) -> exit code``. The parser, the dispatch and the
shell completion are all built from these records, so a command is registered in
one place and one way. Modules here import only the standard library at the top;
what a command needs (the store, the config, Slurm parsing) it imports when it runs,
so ``b300ctl status`` does not pay for the daemon, APScheduler or paramiko.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from ..config import Config
    from ..interfaces import Store


@dataclass(frozen=True, slots=True)
class Arg:
    """One argparse argument as data: ``parser.add_argument(*flags, **options)``."""

    flags: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def is_option(self) -> bool:
        return self.flags[0].startswith("-")

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(str(c) for c in self.options.get("choices") or ())


def arg(*flags: str, **options: Any) -> Arg:
    """An argument, spelt as for ``add_argument``."""
    return Arg(flags, MappingProxyType(dict(options)))


@dataclass(frozen=True, slots=True)
class Command:
    """One b300ctl command (or sub-command, in ``subcommands``).

    ``run(ctx, args)`` returns the exit code and raises :class:`b300.errors.B300Error`
    for anything that ends in a one-line message. ``mutating``: it only sends a
    request to the running daemon (which checks the caller is an admin); it never
    opens the store. A command with ``subcommands`` runs its own ``run`` when none
    is given (``drift`` shows, ``drift scan`` scans).
    """

    name: str
    help: str
    run: Callable[[Context, argparse.Namespace], int]
    arguments: tuple[Arg, ...] = ()
    mutating: bool = False
    needs_config: bool = True
    subcommands: tuple[Command, ...] = ()
    #: Longer text for ``b300ctl PATH --help`` (``help`` is the one line in the command list).
    description: str = ""


def walk(commands: Sequence[Command], prefix: str = "") -> Iterator[tuple[str, Command]]:
    """Every command and sub-command with its path (``"drift"``, ``"drift scan"``)."""
    for c in commands:
        path = f"{prefix} {c.name}".strip()
        yield path, c
        yield from walk(c.subcommands, path)


class Context:
    """What a command runs with: the options every command takes, and the config,
    the (read-only) store and the daemon, each reached only when asked for."""

    def __init__(self, *, config_file: str | None, as_json: bool, mutating: bool = False,
                 commands: Sequence[Command] = (), common: Sequence[Arg] = (),
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.config_file = config_file
        self.json = as_json
        #: The command table b300ctl was started with (for ``completion``).
        self.commands = tuple(commands)
        self.common = tuple(common)
        self.clock = clock
        self._mutating = mutating
        self._config: Config | None = None

    def config(self) -> Config:
        """The config file (``--config``, else ``$B300_CONFIG``, else the default), loaded once."""
        if self._config is None:
            from ..config import config_path, load_config

            self._config = load_config(config_path(self.config_file))
        return self._config

    def open_store(self) -> Store:
        """The state store as it is, for reading (never migrated; writes are refused)."""
        if self._mutating:
            raise AssertionError("a mutating command goes through the daemon, not the store")
        from ..store import open_store_for_reading
        from ..store.credentials import store_url

        config = self.config()
        return open_store_for_reading(store_url(config.database_url, config.database_password_file,
                                                reader=True))

    def ask(self, request: dict[str, Any], *, timeout: float = 180.0) -> tuple[int, dict[str, Any]]:
        """Send a request to the daemon: ``(0, result)``, or ``(exit code, {})`` after its
        one-line refusal was printed on stderr."""
        from ..control.client import ask_daemon

        config = self.config()
        return ask_daemon(config.socket, request, timeout=timeout, admin_group=config.admin_group)
