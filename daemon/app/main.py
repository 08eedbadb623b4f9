"""``b300d``: the daemon's entry point."""

from __future__ import annotations

import argparse
import resource
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime

import structlog

from ..config import Config, config_path, load_config, trigger_program, writable_paths
from ..errors import B300Error, ConfigError, SlurmError, one_line
from ..ha.lease import DbLease, FileLease
from ..interfaces import SlurmClient
from ..ops.logs import configure_logging
from ..plugin_registry import PluginRegistry
from ..safety.permissions import check_not_writable_by_others
from ..slurm import make_slurm_client
from ..slurm.release import SlurmRelease, check_release, parse_release, record_release
from ..store import create_engine, open_store
from ..store.credentials import store_url
from .root import build_daemon


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"b300d: error: {one_line(message)}", file=sys.stderr)
        sys.exit(2)


def _check_slurm_release(slurm: SlurmClient, state_dir: str) -> None:
    """Log and record the Slurm release; refuse one older than the oldest tested (exit 3).

    A release that cannot be read (a tool failing, a backend without ``version``) is
    logged as unknown and not held against the start: the poll cycle reports Slurm errors.
    """
    log = structlog.get_logger("b300d")
    backend = slurm.name
    release: SlurmRelease | None = None
    try:
        release = parse_release(slurm.version())
    except (SlurmError, ValueError) as exc:
        log.warning("slurm.release_unknown", backend=backend, error=str(exc))
    if release is not None:
        check_release(release)
        log.info("slurm.release", version=release.text, release=release.release, backend=backend)
    record_release(state_dir, release, backend, datetime.now(UTC))


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(prog="b300d", description="Keeps training runs alive on a Slurm cluster.")
    ap.add_argument("--config", help="config file (default: $B300_CONFIG or /etc/b300/b300.toml)")
    ap.add_argument("--once", action="store_true", help="run one poll cycle, print it, and exit")
    ap.add_argument("--print-paths", action="store_true",
                    help="print the folders the daemon writes, one a line, and exit "
                         "(deploy/install.sh makes them the unit's ReadWritePaths)")
    ap.add_argument("--remove-trigger", action="store_true",
                    help="clear the node-down strigger this daemon set (it is PERM: it outlives "
                         "the daemon) and exit; deploy/install.sh --uninstall runs it")
    ap.add_argument("--check-config", action="store_true",
                    help="run every start-up check (folders, plugins, Slurm, database schema, SSH to "
                         "[drift] nodes, trigger permission, SMTP, offsite targets) without acting on "
                         "anything; one line each; exit 0 all passed, 1 any failed, 2 bad config")
    ap.add_argument("--version", action="store_true",
                    help="print the version and the state store schema it migrates to, and exit")
    args = ap.parse_args(argv)
    if args.version:
        from ..version import version_text

        print(version_text("b300d"))
        return 0
    if args.check_config:
        from .preflight_checks import check_config

        return check_config(config_path(args.config))
    try:
        path = config_path(args.config)
        if args.print_paths:
            print("\n".join(writable_paths(load_config(path))))
            return 0
        if args.remove_trigger:
            return _remove_trigger(load_config(path))
        check_not_writable_by_others(path, "config file")
        cfg = load_config(path)
        check_not_writable_by_others(cfg.state_dir, "state directory")
        configure_logging(cfg.log_format, cfg.log_level)
        _raise_open_files_limit()
        file_lease = FileLease(cfg.state_dir)
        file_lease.acquire(threading.Event())
        plugins = PluginRegistry()  # every plugin group, loaded once for the daemon's life
        slurm = make_slurm_client(cfg.slurm_backend, slurm_conf=cfg.slurm_conf,
                                  bin_dir=cfg.slurm_bin_dir, timeout=cfg.slurm_timeout_s, plugins=plugins)
        # Before the store: a refused release leaves the database (and its schema) untouched.
        _check_slurm_release(slurm, cfg.state_dir)
        url = store_url(cfg.database_url, cfg.database_password_file, reader=False)
        store = open_store(url)
        # The lease has its own engine and short timeouts (b300.ha.lease): a renewal
        # must neither wait behind the store's calls nor outlive a fraction of the TTL.
        call_timeout = max(1.0, cfg.lease_ttl_s / 4)
        lease = DbLease(create_engine(url, statement_timeout_s=call_timeout,
                                      lock_timeout_s=call_timeout / 2,
                                      connect_timeout_s=max(2, int(call_timeout)), pool_size=1,
                                      application_name="b300d-lease"),
                        cfg.lease_name, ttl_s=cfg.lease_ttl_s, call_timeout_s=call_timeout)
        daemon = build_daemon(cfg, store, slurm, plugins=plugins, lease=lease)
        if args.once:
            if not lease.try_acquire():
                raise ConfigError("another b300d is active (it holds the lease); --once not run")
            try:
                report = daemon.parts.cycles.cycle.run_once()
            finally:
                lease.release()
            print(f"tracked={report.tracked} changed={report.changed} "
                  f"slurm_calls={report.slurm_calls} wall_s={report.wall_s:.3f}")
            store.close()
            return 0
    except B300Error as exc:
        print(f"b300d: {exc}", file=sys.stderr)
        return exc.exit_code

    def _on_signal(signum: int, _frame: object) -> None:
        structlog.get_logger("b300d").info("daemon.signal", signal=signal.Signals(signum).name)
        daemon.stop()

    def _on_hup(_signum: int, _frame: object) -> None:
        structlog.get_logger("b300d").info("daemon.signal", signal="SIGHUP")
        daemon.request_reload()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_hup)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        # A standby answers b300ctl and waits in serve() until the lease is free.
        return daemon.serve()
    except B300Error as exc:
        print(f"b300d: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        file_lease.release()


def _raise_open_files_limit() -> None:
    """The liveness checks keep a socket per node in flight: take the hard limit of open
    files (systemd's default soft limit, 1024, is less than a large cluster's nodes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            structlog.get_logger("b300d").warning("rlimit.nofile_unchanged", soft=soft, hard=hard)


def _remove_trigger(cfg: Config) -> int:
    from ..slurm.cli import CliSlurmClient

    program = trigger_program(cfg)
    client = CliSlurmClient(slurm_conf=cfg.slurm_conf, bin_dir=cfg.slurm_bin_dir,
                            timeout=cfg.slurm_timeout_s)
    print(f"removed {client.remove_node_down_trigger(program)} node-down trigger(s) of {program}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
