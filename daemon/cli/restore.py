"""``b300ctl checkpoints restore RUN [--target NAME] [--step N] --to DIR``: a checkpoint
back from an offsite copy, verified file by file.

It runs here, in b300ctl, as the invoking user (it writes where the operator says)
and needs no running daemon: the store says which checkpoints of the run have a
complete, verified copy on which target; the target is built from
``[[checkpoints.targets]]`` through the same plugin registry the daemon uses; the
files are fetched by :func:`b300.checkpoints.fetch.fetch_replica`, which refuses
the whole restore on the first file whose size or sha256 differs from the manifest
and leaves nothing at DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .command import Command, Context, arg
from .output import print_json, size

if TYPE_CHECKING:
    from ..checkpoints.fetch import FetchedFile
    from ..checkpoints.manifest import Manifest
    from ..checkpoints.policy import TargetConfig
    from ..checkpoints.restore_plan import RestoreChoice
    from ..interfaces import ReplicationTarget
    from ..plugin_registry import PluginRegistry

_MISSING_SHOWN = 5  # replicas named in "none is on its target any more"

DESCRIPTION = """\
Fetch a checkpoint of RUN from an offsite target into DIR and check every file
against the checkpoint's manifest (size and sha256) before declaring success.

By default the newest checkpoint with a complete, verified copy is restored, from
the first configured target that holds it; --target and --step narrow the choice.
DIR must not exist or be empty. The files arrive in a temporary folder beside DIR
(.DIR.b300-restore-*) that is renamed to DIR only when all of them matched, so a
failed or interrupted restore leaves nothing at DIR. The restored folder holds the
manifest too, so b300d verifies it like the original. A Megatron-LM legacy
checkpoint restored as ROOT/iter_N (or ROOT/release) into a ROOT without
latest_checkpointed_iteration.txt gets one naming it, as Megatron-LM's save would
have written. Runs as you, here; b300d need not be running.

exit codes: 0 restored; 2 wrong input (unknown run, target or step, no verified
copy, DIR not empty, unreadable credentials); 4 state store unavailable; 6 the
copy failed (target unreachable, a file missing or not matching its manifest);
130 interrupted."""


def run_restore(ctx: Context, args: argparse.Namespace) -> int:
    from ..checkpoints.fetch import check_destination
    from ..checkpoints.restore_plan import restore_choices
    from ..errors import TransferError, UsageError
    from ..plugin_registry import PluginRegistry

    if args.step is not None and args.step < 0:
        raise UsageError(f"--step must be 0 or more, got {args.step}")
    if args.concurrency is not None and not 1 <= args.concurrency <= 64:
        raise UsageError(f"--concurrency must be 1 to 64, got {args.concurrency}")
    cfg = ctx.config()
    store = ctx.open_store()
    try:
        store.get_run(args.run)  # NotFoundError: unknown run
        stored = store.checkpoints.checkpoints(args.run, include_deleted=True)
    finally:
        store.close()
    choices = restore_choices(args.run, stored, [t.name for t in cfg.checkpoints.targets],
                              target=args.target, step=args.step)
    check_destination(args.to)  # before any connection: a refusal costs nothing
    configs = {t.name: t for t in cfg.checkpoints.targets}
    concurrency = args.concurrency or cfg.checkpoints.replication_concurrency
    plugins = PluginRegistry()
    missing: list[str] = []
    with _targets() as opened:
        for choice in choices:  # bounded: the run's checkpoints times the targets
            if choice.target not in opened:
                opened[choice.target] = _open(configs[choice.target], args.run, plugins)
            manifest = _manifest(opened[choice.target], choice)
            if manifest is None:
                missing.append(f"step {choice.step} on {choice.target}")
                continue
            if missing:
                print(f"b300ctl: not on the target any more, skipped: {', '.join(missing)}", file=sys.stderr)
            return _fetch(ctx, args, choice, opened[choice.target], manifest, concurrency)
    shown = ", ".join(missing[:_MISSING_SHOWN]) + (", ..." if len(missing) > _MISSING_SHOWN else "")
    raise TransferError(f"the store lists verified copies of run {args.run}, but none is on its target "
                        f"any more ({shown}); see b300ctl checkpoints {args.run}")


@contextlib.contextmanager
def _targets() -> Iterator[dict[str, ReplicationTarget]]:
    opened: dict[str, ReplicationTarget] = {}
    try:
        yield opened
    finally:
        for target in opened.values():
            with contextlib.suppress(Exception):  # closing a broken connection must not hide why
                target.close()


def _open(t: TargetConfig, run_id: str, plugins: PluginRegistry) -> ReplicationTarget:
    """The target plugin for this run; ConfigError for an unreadable secret, UsageError for
    options the plugin refuses, TransferError when it cannot connect."""
    from ..checkpoints.fetch import describe
    from ..checkpoints.replicate import load_target
    from ..errors import B300Error, TransferError, UsageError

    options = t.options_for(run_id)  # ConfigError (2): a secret file missing or unreadable
    try:
        return load_target(t.kind, options, plugins)
    except B300Error:
        raise
    except ValueError as exc:  # the plugin's own check of its options
        raise UsageError(f"target {t.name}: {describe(exc)}") from None
    except Exception as exc:  # connecting may raise anything (socket, ssh, botocore)
        raise TransferError(f"target {t.name} is unreachable: {describe(exc)}") from None


def _manifest(target: ReplicationTarget, choice: RestoreChoice) -> Manifest | None:
    """The manifest in the replica's record on the target; None when there is no record."""
    from ..checkpoints.fetch import describe
    from ..checkpoints.replicate import ReplicaRecord
    from ..errors import TransferError

    try:
        data = target.get_record(choice.name)
    except Exception as exc:  # network, permissions, the client library's own errors
        raise TransferError(f"target {choice.target} is unreachable: {describe(exc)}") from None
    if data is None:
        return None
    try:
        return ReplicaRecord.from_json(data).manifest
    except (ValueError, KeyError, TypeError):
        raise TransferError(f"the record of replica {choice.name} on {choice.target} is unreadable") from None


def _fetch(ctx: Context, args: argparse.Namespace, choice: RestoreChoice, target: ReplicationTarget,
           manifest: Manifest, concurrency: int) -> int:
    import os

    from ..checkpoints.fetch import fetch_replica
    from ..checkpoints.replicate import point_megatron_tracker

    files: list[dict[str, Any]] = []

    def on_file(f: FetchedFile) -> None:
        files.append({"path": f.rel, "size_bytes": f.size, "sha256": f.sha256, "seconds": round(f.seconds, 3)})
        if args.verbose and not ctx.json:
            print(f"  {f.rel}  {size(f.size)}  {f.seconds:.2f} s  sha256 ok", flush=True)

    with _interrupt_on_sigterm():
        result = fetch_replica(target, choice.name, manifest, args.to, concurrency=concurrency, on_file=on_file)
    if os.path.basename(result.path) == choice.name:  # DIR is ROOT/iter_N: the root may need its tracker
        point_megatron_tracker(choice.name, os.path.dirname(result.path), manifest)
    mb_s = result.bytes / 1e6 / result.seconds if result.seconds > 0 else None
    report: dict[str, Any] = {
        "run": args.run, "target": choice.target, "step": choice.step, "replica": choice.name,
        "to": result.path, "files": result.files, "bytes": result.bytes,
        "seconds": round(result.seconds, 3), "mb_per_s": None if mb_s is None else round(mb_s, 1),
        "verified": True,
    }
    if args.verbose:
        report["file_list"] = sorted(files, key=lambda f: str(f["path"]))
    if ctx.json:
        print_json(report)
    else:
        rate = "" if mb_s is None else f", {mb_s:.1f} MB/s"
        print(f"restored run {args.run} step {choice.step} ({choice.name}) from {choice.target} into "
              f"{result.path}: {result.files} files, {size(result.bytes)} in {result.seconds:.2f} s{rate}; "
              "every file matched the manifest's size and sha256")
    return 0


@contextlib.contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the restore like Ctrl-C (cleaning up the temporary folder), not mid-write."""
    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


RESTORE = Command(
    "restore", "fetch a checkpoint back from an offsite target into a folder, verified",
    run_restore, description=DESCRIPTION, arguments=(
        arg("run", metavar="RUN", help="run id"),
        arg("--to", required=True, metavar="DIR", help="folder to restore into (must not exist or be empty)"),
        arg("--target", default=None, metavar="NAME",
            help="take the copy on this [[checkpoints.targets]] name (default: the first that has one)"),
        arg("--step", type=int, default=None, metavar="N",
            help="restore the checkpoint of this step (default: the newest with a verified copy)"),
        arg("--concurrency", type=int, default=None, metavar="N",
            help="files fetched at once (default: [checkpoints] replication_concurrency)"),
        arg("-v", "--verbose", action="store_true", help="one line per file as it arrives and matches"),
    ))
