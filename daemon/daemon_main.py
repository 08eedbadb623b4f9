"""``b300d``: the daemon's entry point."""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
from collections.abc import Sequence
from typing import IO

import structlog

from .config import config_path, load_config
from .errors import B300Error, ConfigError
from .logs import configure_logging
from .service import Daemon
from .slurm import make_slurm_client
from .store import open_store


def _lock(state_dir: str) -> IO[str]:
    """Hold ``b300d.lock`` for the process's life: one daemon per state directory."""
    os.makedirs(state_dir, mode=0o750, exist_ok=True)
    path = os.path.join(state_dir, "b300d.lock")
    f = open(path, "a+")  # noqa: SIM115 - held open on purpose until the process exits
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise ConfigError(f"another b300d already runs with state_dir {state_dir} "
                          f"(pid {f.read().strip() or '?'})") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"b300d: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(prog="b300d", description="Keeps training runs alive on a Slurm cluster.")
    ap.add_argument("--config", help="config file (default: $B300_CONFIG or /etc/b300/b300.toml)")
    ap.add_argument("--once", action="store_true", help="run one poll cycle, print it, and exit")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(config_path(args.config))
        configure_logging(cfg.log_format, cfg.log_level)
        lock = _lock(cfg.state_dir)
        store = open_store(cfg.database_url)
        slurm = make_slurm_client(cfg.slurm_backend, slurm_conf=cfg.slurm_conf,
                                  bin_dir=cfg.slurm_bin_dir, timeout=cfg.slurm_timeout_s)
        daemon = Daemon(cfg, store, slurm)
        if args.once:
            report = daemon.tracker.poll_once()
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
        daemon.serve()
    finally:
        lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
