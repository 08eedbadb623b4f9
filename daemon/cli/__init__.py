"""``b300ctl``: the operators' command line (entry point :func:`main`).

Queries read the state store directly (opened as it is: never migrated, never
written); commands that change something are requests to the running daemon over
its control socket, so that only the daemon acts on the cluster and the store.
Every command is a :class:`~b300.cli.command.Command` record in one of the modules
listed in :data:`COMMANDS`; the parser, the dispatch and the bash completion are
built from them.

One error policy, here: a :class:`b300.errors.B300Error` is one line on stderr and
its exit code (0 ok, 2 wrong input: bad spec/config/argument, unknown run, or a
refusal by the daemon; 3 Slurm refused; 4 state store unavailable; 5 daemon not
reachable; 6 a copy from an offsite target failed or did not verify); a usage error
is one line and 2; a reader that leaves (``| head``) ends it quietly with 0; Ctrl-C
is 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import B300Error, one_line
from . import checkpoints, completion, drift, drill, events, nodes, report, runs, status
from .command import Arg, Command, Context, arg, walk

__all__ = ["COMMANDS", "COMMON", "build_parser", "main"]

#: Every command, in the order ``b300ctl --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    *status.COMMANDS, *runs.COMMANDS, *nodes.COMMANDS, *events.COMMANDS, *checkpoints.COMMANDS,
    *drift.COMMANDS, *drill.COMMANDS, *report.COMMANDS, *completion.COMMANDS,
)
#: Options every command takes, before or after its name. SUPPRESS keeps a later
#: (sub-command) default from overwriting a value given earlier.
COMMON: tuple[Arg, ...] = (
    arg("--config", default=argparse.SUPPRESS,
        help="config file (default: $B300_CONFIG or /etc/b300/b300.toml)"),
    arg("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of tables"),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"b300ctl: error: {one_line(message)}", file=sys.stderr)
        sys.exit(2)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if not isinstance(action, _SubcommandsOrOwn):  # any word may be the command's own positional
            super()._check_value(action, value)


class _SubcommandsOrOwn(argparse._SubParsersAction):  # type: ignore[type-arg]
    """The sub-commands of a command that also takes positionals of its own
    (``checkpoints [RUN]`` beside ``checkpoints restore RUN``).

    argparse hands positionals out by position, never by value, so a command's
    optional positional would swallow the sub-command's name. Here the command's
    positionals live in ``own`` instead: a first word that names no sub-command is
    parsed, with the rest of the line, by ``own``.
    """

    own: argparse.ArgumentParser | None = None

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if self.own is None or not values or values[0] in self._name_parser_map:
            super().__call__(parser, namespace, values, option_string)
            return
        setattr(namespace, self.dest, None)
        sub, extra = self.own.parse_known_args(list(values), None)
        for key, value in vars(sub).items():
            setattr(namespace, key, value)
        if extra:
            namespace.__dict__.setdefault(argparse._UNRECOGNIZED_ARGS_ATTR, []).extend(extra)


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    """The argparse parser of ``commands``; the chosen record is ``args.command_record``."""
    common = _Parser(add_help=False)
    _add(common, COMMON)
    changes = ", ".join(path for path, c in walk(commands) if c.mutating)
    ap = _Parser(prog="b300ctl", description="Drive the b300 orchestrator.", parents=[common],
                 epilog=f"{changes}, nodes resume, nodes triage and checkpoints --prune --yes are requests "
                        "to the running b300d (admins only); the rest read the state store (status asks "
                        "this host's b300d first).")
    ap.add_argument("--version", action=_Version, help="print the version and the state store schema, "
                                                       "and exit")
    _add_commands(ap, commands, [common], "command", required=True)
    return ap


class _Version(argparse.Action):
    """``--version``: computed when asked (reading the package metadata costs every other run)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from ..version import version_text

        print(version_text("b300ctl"))
        parser.exit(0)


def _add(parser: argparse.ArgumentParser, arguments: Sequence[Arg]) -> None:
    for a in arguments:
        parser.add_argument(*a.flags, **a.options)


def _add_commands(parser: argparse.ArgumentParser, commands: Sequence[Command],
                  parents: list[_Parser], dest: str, *, required: bool) -> argparse.Action:
    sub = parser.add_subparsers(dest=dest, required=required, parser_class=_Parser)
    for c in commands:
        p = sub.add_parser(c.name, help=c.help, description=c.description or None, parents=parents,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        own = [a for a in c.arguments if not a.is_option]
        if not (c.subcommands and own):
            _add(p, c.arguments)
            p.set_defaults(command_record=c)
            if c.subcommands:
                _add_commands(p, c.subcommands, parents, f"{dest}_{c.name}", required=False)
            continue
        # Positionals and sub-commands: the positionals go to a parser of their own
        # (see _SubcommandsOrOwn); the options stay here, and there without defaults,
        # so a value given before the positional is not reset after it.
        _add(p, [a for a in c.arguments if a.is_option])
        p.set_defaults(command_record=c, **{a.options.get("dest", a.flags[0]): a.options.get("default")
                                            for a in own})
        p.register("action", "parsers", _SubcommandsOrOwn)
        names = "|".join(s.name for s in c.subcommands)
        words = " ".join(f"[{a.options.get('metavar', a.flags[0])}]" for a in own)
        action = _add_commands(p, c.subcommands, parents, f"{dest}_{c.name}", required=False)
        assert isinstance(action, _SubcommandsOrOwn)
        action.metavar = f"{{{names}}} ... | {words}"
        action.help = "; ".join(f"{a.flags[0]}: {a.options.get('help', '')}" for a in own)
        action.help += "; or a sub-command:"
        own_parser = _Parser(prog=p.prog, parents=parents)  # its --help: after the positional
        _add(own_parser, own)
        _add(own_parser, [arg(*a.flags, **{**a.options, "default": argparse.SUPPRESS})
                          for a in c.arguments if a.is_option])
        action.own = own_parser
    return sub


def main(argv: Sequence[str] | None = None) -> int:
    """Run one b300ctl command line; returns the exit code (see the module docstring)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a usage error already printed (2)
        return exc.code if isinstance(exc.code, int) else 2
    command: Command = args.command_record
    ctx = Context(config_file=getattr(args, "config", None), as_json=getattr(args, "json", False),
                  mutating=command.mutating, commands=COMMANDS, common=COMMON)
    try:
        if command.needs_config:
            ctx.config()  # a bad config is the first thing to hear about, whatever the command
        return command.run(ctx, args)
    except B300Error as exc:
        print(f"b300ctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (b300ctl events | head): stop quietly, and keep Python's
        # own flush at exit from failing on the same pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
