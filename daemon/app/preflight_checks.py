"""The checks of ``b300d --check-config`` that talk to the world (see :mod:`b300.app.preflight`).

Each returns its report lines and changes nothing: no migration, no lock, no
socket, no trigger, no mail sent, no file left behind (a folder's write test
creates a temporary file and deletes it). Every network call has its own
timeout, shorter than the check's budget in :func:`checks`.
"""

from __future__ import annotations

import grp
import math
import os
import pwd
import shutil
import smtplib
import ssl
import subprocess
import tempfile
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Any

from ..config import Config, writable_paths
from ..errors import B300Error, ConfigError, SlurmError
from ..plugin_registry import (
    CHECKPOINT_LAYOUTS,
    DRIFT_PROBES,
    REPLICATION_TARGETS,
    SLURM_BACKENDS,
    PluginGroup,
    PluginRegistry,
)
from ..safety.permissions import check_not_writable_by_others, check_secret_file
from .preflight import (
    Check,
    CheckFn,
    backend_reason,
    exit_code,
    fail,
    listing_root,
    migration_check,
    ok,
    parse_slurm_user,
    run_checks,
    skip,
    trigger_check,
)

#: Seconds any one network call of a check may take.
CALL_TIMEOUT_S = 5.0
#: Nodes the SSH check reaches at once (a thread each): every node of most clusters.
SSH_PARALLEL = 256
SLURM_TOOLS = ("sbatch", "squeue", "sacct", "sinfo", "scontrol", "scancel", "strigger")
_PROBE_RUN = "b300-check-config"  # fills {run} in a target's options to list it


def service_user() -> tuple[str, int]:
    """The user running the check (the one b300d runs as when started the same way)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return f"uid {uid}", uid


def check_config(path: str) -> int:
    """``b300d --check-config``: print one line per check; 0 all passed, 1 any failed,
    2 when the config does not parse (that one line only)."""
    from ..config import load_config
    from ..ops.logs import configure_logging

    try:
        cfg = load_config(path)
    except ConfigError as exc:
        print(f"FAIL config: {exc}")
        return 2
    # The checks' own log lines (a plugin skipped, paramiko) only when they are errors, on stderr.
    configure_logging("auto", "error")
    head = [ok(f"config {path}: parses")]
    head.append(ok(_mode_words(cfg)))
    lines = head + run_checks(checks(cfg, PluginRegistry()))
    for c in lines:
        print(c.line(), flush=True)
    return exit_code(lines)


def _mode_words(cfg: Config) -> str:
    """What the daemon will do of its own accord with this config (b300.safety.mode)."""
    from ..config.action_policy import action_policy

    p = action_policy(cfg)
    if not p.acting:
        said = "" if cfg.mode_set else " (not set: the default)"
        return f"mode: {cfg.mode}{said}: records, alerts, reports; acts on nothing of its own accord"
    acts = [what for what, on in (("drains/resubmits", p.nodes_and_runs), ("signals", p.signals),
                                  ("deletes checkpoints", p.deletes), ("holds spare pools", p.reservations))
            if on]
    return f"mode: act: {', '.join(acts)}" + (f"; not: {p.why}" if p.why else "")


def checks(cfg: Config, plugins: PluginRegistry) -> list[tuple[str, float, CheckFn]]:
    """Every check after the config parsed, with its time budget in seconds."""
    ssh_rounds = max(1, math.ceil(len(cfg.drift.nodes if cfg.drift else ()) / SSH_PARALLEL))
    return [
        ("permissions", 3.0, lambda: check_permissions(cfg)),
        ("folders", 5.0, lambda: check_folders(cfg)),
        ("plugins", 10.0, lambda: check_plugins(plugins)),
        ("slurm", 4 * CALL_TIMEOUT_S + 2, lambda: check_slurm(cfg, plugins)),
        ("database", 2 * CALL_TIMEOUT_S + 2, lambda: check_database(cfg.database_url)),
        ("node trigger", CALL_TIMEOUT_S + 2, lambda: check_trigger(cfg)),
        # A jump host's connection, then each node's and `true` (SSH_PARALLEL nodes at once).
        ("ssh", (3 * CALL_TIMEOUT_S + 4) * ssh_rounds, lambda: check_ssh(cfg)),
        ("smtp", 3 * CALL_TIMEOUT_S + 2, lambda: check_smtp(cfg)),
        ("targets", 2 * CALL_TIMEOUT_S, lambda: check_targets(cfg, plugins)),
    ]


def check_permissions(cfg: Config) -> list[Check]:
    """What b300d refuses at start (a config file or state folder others may change, a spare
    pool without a user to name) and who may change things through b300ctl."""
    out = []
    for path, what in ((cfg.path, "config file"), (cfg.state_dir, "state directory")):
        try:
            check_not_writable_by_others(path, what)
            out.append(ok(f"{what} {path}: no other user may change it"))
        except ConfigError as exc:
            out.append(fail(f"{exc}", "b300d refuses to start so"))
    if cfg.admin_group:
        try:
            members = grp.getgrnam(cfg.admin_group).gr_mem
            out.append(ok(f"admin_group {cfg.admin_group}: exists ({len(members)} listed members); its "
                          "members may change things through b300ctl"))
        except KeyError:
            out.append(fail(f"admin_group {cfg.admin_group}: no such group: only root and the daemon's "
                            "user could change things through b300ctl",
                            f"groupadd {cfg.admin_group}, or fix [daemon] admin_group"))
    if cfg.spares.pools:
        from ..spares.pools import pool_user

        try:
            out.append(ok(f"[spares] pools: reservations made for user {pool_user(cfg.spares)}"))
        except ConfigError as exc:
            out.append(fail(str(exc), "b300d refuses to start so"))
    return out


def check_folders(cfg: Config) -> list[Check]:
    """Each folder the daemon writes: there (or creatable) and writable by this user,
    tried with a real temporary file."""
    user, _uid = service_user()
    kinds: dict[str, str] = {}  # a folder serving several purposes is named by the first
    for path, kind in ((cfg.state_dir, "state_dir"), (os.path.dirname(cfg.socket), "socket folder"),
                       (cfg.job_log_dir, "job_log_dir")):
        if path:
            kinds.setdefault(os.path.normpath(path), kind)
    return [_writable(path, kinds.get(path, "checkpoint root"), user) for path in writable_paths(cfg)]


def _writable(path: str, kind: str, user: str) -> Check:
    what = f"{kind} {path}"
    if not os.path.lexists(path):
        parent = path
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        if os.access(parent, os.W_OK | os.X_OK):
            return ok(f"{what}: not there yet; {user} may create it ({parent} is writable)")
        return fail(f"{what}: missing, and {user} cannot create it in {parent}",
                    f"install -d -o {user} -m 0750 {path}")
    if not os.path.isdir(path):
        return fail(f"{what}: not a folder", "point the setting at a folder")
    if not os.access(path, os.W_OK | os.X_OK):
        return fail(f"{what}: not writable by {user}", f"chown {user} {path} (or run b300d as its owner)")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".b300-check-", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return fail(f"{what}: {user} cannot create a file there ({exc.strerror or exc})",
                    "check the file system is mounted read-write and has room")
    return ok(f"{what}: writable by {user} (created and deleted a file)")


def check_plugins(plugins: PluginRegistry) -> list[Check]:
    out = []
    groups: tuple[PluginGroup[Any], ...] = (SLURM_BACKENDS, CHECKPOINT_LAYOUTS, REPLICATION_TARGETS,
                                             DRIFT_PROBES)
    for group in groups:
        loaded = plugins.load(group)
        names = ", ".join(loaded.plugins) or "none"
        if loaded.skipped:
            why = "; ".join(f"{n}: {w}" for n, w in sorted(loaded.skipped.items()))
            out.append(fail(f"plugins {group.entry_points}: loaded {names}; did not load: {why[:400]}",
                            "reinstall or remove the plugin's distribution"))
        else:
            out.append(ok(f"plugins {group.entry_points}: {names}"))
    return out


def _slurm_env(cfg: Config) -> dict[str, str]:
    env = dict(os.environ)
    if cfg.slurm_conf:
        env["SLURM_CONF"] = cfg.slurm_conf
    env.setdefault("LC_ALL", "C")
    return env


def _tool(cfg: Config, name: str) -> str | None:
    return shutil.which(name, path=cfg.slurm_bin_dir) if cfg.slurm_bin_dir else shutil.which(name)


def check_slurm(cfg: Config, plugins: PluginRegistry) -> list[Check]:
    """Tools found, ``sinfo -V`` release, the controller answering, the backend chosen."""
    from ..slurm.cli import CliSlurmClient
    from ..slurm.release import check_release, parse_release

    where = cfg.slurm_bin_dir or "PATH"
    missing = [t for t in SLURM_TOOLS if _tool(cfg, t) is None]
    if missing:
        return [fail(f"Slurm tools: {', '.join(missing)} not found in {where}",
                     "install the Slurm client tools or set [slurm] bin_dir to their folder")]
    out = [ok(f"Slurm tools: {', '.join(SLURM_TOOLS)} found in {where}")]
    client = CliSlurmClient(slurm_conf=cfg.slurm_conf, bin_dir=cfg.slurm_bin_dir,
                            timeout=min(cfg.slurm_timeout_s, CALL_TIMEOUT_S))
    try:
        release = parse_release(client.version())
        check_release(release)
        out.append(ok(f"Slurm release {release.text} (sinfo -V)"))
    except (SlurmError, ValueError) as exc:
        out.append(fail(f"Slurm release: {exc}", "b300d needs Slurm 22.05 or newer"))
    conf = f" (SLURM_CONF={cfg.slurm_conf})" if cfg.slurm_conf else ""
    code, ping = _scontrol(cfg, "ping")
    ping = "; ".join(line.strip() for line in ping.splitlines() if line.strip())[:300]
    try:
        if code != 0:
            raise SlurmError(f"scontrol ping: {ping or f'exit {code}'}", transient=True)
        nodes = client.nodes()
        out.append(ok(f"Slurm controller answers{conf}: {ping}; sinfo lists {len(nodes)} nodes"))
    except SlurmError as exc:
        out.append(fail(f"Slurm controller{conf}: {exc}", "check slurmctld runs and [slurm] conf names "
                                                           "its slurm.conf"))
    why_not: str | None = None
    if cfg.slurm_backend in ("auto", "pyslurm"):
        if "pyslurm" in plugins.load(SLURM_BACKENDS).plugins:
            from ..slurm.pyslurm_backend import pyslurm_available

            why_not = pyslurm_available(cfg.slurm_conf, timeout=CALL_TIMEOUT_S)
        else:
            why_not = "the pyslurm backend plugin did not load"
    backend, why = backend_reason(cfg.slurm_backend, why_not)
    if cfg.slurm_backend == "pyslurm" and why_not is not None:
        out.append(fail(f"Slurm backend pyslurm (configured): {why_not}",
                        'set [slurm] backend = "auto" or "cli", or build pyslurm for this Slurm'))
    else:
        out.append(ok(f"Slurm backend {backend} ([slurm] backend = {cfg.slurm_backend}): {why}"))
    return out


def check_database(url: str) -> list[Check]:
    """Reachable, and its schema against this code's head; never migrated, never created."""
    from sqlalchemy.engine import make_url

    from ..store import create_engine
    from ..store.sessions import masked

    parsed = make_url(url)
    where = masked(parsed)
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
        return [ok(f"database {where}: no file yet; b300d creates it and migrates it to head")]
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(files("b300.sql")))
    heads = set(script.get_heads())
    known = {s.revision for s in script.walk_revisions()}
    engine = create_engine(url, statement_timeout_s=CALL_TIMEOUT_S, lock_timeout_s=CALL_TIMEOUT_S / 2,
                           connect_timeout_s=int(CALL_TIMEOUT_S), pool_size=1, read_only=True,
                           application_name="b300d-check")
    try:
        with engine.connect() as connection:
            current = set(MigrationContext.configure(connection).get_current_heads())
    except Exception as exc:
        text = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        return [fail(f"database {where}: not reachable: {type(exc).__name__}: {text}",
                     "check [daemon] database_url, the server and its credentials")]
    finally:
        engine.dispose()
    return [migration_check(where, current, heads, known)]


def check_trigger(cfg: Config) -> list[Check]:
    if not cfg.recovery.enabled or not cfg.recovery.node_trigger:
        off = "node_trigger = false" if cfg.recovery.enabled else "enabled = false"
        return [skip(f"node-down trigger: not armed ([recovery] {off})")]
    user, uid = service_user()
    if uid == 0:  # root may always: no need to ask Slurm
        return [trigger_check(user, uid, None)]
    code, text = _scontrol(cfg, "show", "config")
    return [trigger_check(user, uid, parse_slurm_user(text) if code == 0 else None)]


def _scontrol(cfg: Config, *args: str) -> tuple[int, str]:
    """``scontrol ARGS`` (read-only queries): exit code and output (stderr when it failed)."""
    tool = _tool(cfg, "scontrol")
    if tool is None:
        return 127, "scontrol not found"
    try:
        proc = subprocess.run([tool, *args], capture_output=True, text=True, check=False,
                              timeout=CALL_TIMEOUT_S, env=_slurm_env(cfg), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {CALL_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return 126, str(exc)
    return proc.returncode, proc.stdout if proc.returncode == 0 else (proc.stderr or proc.stdout)


def check_ssh(cfg: Config) -> list[Check]:
    """Connect, authenticate and run ``true`` on every [drift] node at once, host keys checked."""
    if cfg.drift is None or not cfg.drift.nodes:
        return [skip("SSH to [drift] nodes: no [drift] nodes configured")]
    from ..drift.scan_records import NodeStatus
    from ..drift.ssh import ParamikoRunner

    s = cfg.drift.ssh
    if not os.access(s.known_hosts, os.R_OK):
        return [fail(f"SSH: known_hosts {s.known_hosts} not readable",
                     "create it with the nodes' host keys (ssh-keyscan, checked by hand)")]
    quick = replace(s, connect_timeout_s=min(s.connect_timeout_s, CALL_TIMEOUT_S),
                    command_timeout_s=CALL_TIMEOUT_S, concurrency=SSH_PARALLEL)
    names = [n.name for n in cfg.drift.nodes]
    runs = ParamikoRunner(quick, cfg.drift.endpoints()).run(names, {"true": "true"})
    bad = []
    for name in names:
        r = runs[name]
        code = r.results.get("true")
        if r.status is NodeStatus.OK and code is not None and code.exit_code == 0:
            continue
        fix = {NodeStatus.HOSTKEY: f"verify the node's host key and fix {s.known_hosts}",
               NodeStatus.AUTH: f"install the key of user {s.user} on the node"}.get(
                   r.status, "check the node is up and its sshd reachable")
        bad.append(fail(f"SSH {s.user}@{name}: {r.status.value}: {r.error or 'true did not exit 0'}", fix))
    if len(bad) > 20:
        bad = [*bad[:20], fail(f"SSH: {len(bad) - 20} more nodes failed", "see the lines above")]
    via = f" via {s.jump.host}" if s.jump else ""
    return bad or [ok(f"SSH as {s.user} to all {len(names)} [drift] nodes{via}: host keys verified, "
                      "authenticated, ran true")]


def check_smtp(cfg: Config) -> list[Check]:
    """Connect, STARTTLS when set, log in with the password file, QUIT: no mail sent."""
    smtp = cfg.report.smtp
    if smtp is None:
        return [skip("SMTP: no [report] mail server configured")]
    where = f"SMTP {smtp.host}:{smtp.port}"
    step = "connect"
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=CALL_TIMEOUT_S) as client:
            client.ehlo()
            if smtp.starttls:
                step = "STARTTLS"
                client.starttls(context=ssl.create_default_context(cafile=smtp.ca_file or None))
                client.ehlo()
            if smtp.user:
                step = "login"
                check_secret_file(smtp.password_file, "the SMTP password file")
                password = Path(smtp.password_file).read_text(encoding="utf-8").strip()
                client.login(smtp.user, password)
            step = "QUIT"
    except B300Error as exc:
        return [fail(f"{where}: {exc}", "fix the password file's owner and mode (0600)")]
    except (smtplib.SMTPException, OSError, ValueError) as exc:
        fix = {"connect": "check smtp_host/smtp_port and that the server is reachable",
               "STARTTLS": "check the server offers STARTTLS and ca_file names its CA",
               "login": "check smtp_user and the password in password_file"}.get(step, "")
        return [fail(f"{where}: {step} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}",
                     fix)]
    tls = ", STARTTLS" if smtp.starttls else ""
    login = f", logged in as {smtp.user}" if smtp.user else ""
    return [ok(f"{where}: connected{tls}{login}, quit without sending")]


def check_targets(cfg: Config, plugins: PluginRegistry) -> list[Check]:
    """Each offsite target lists (a filesystem target: its folder above ``{run}`` exists)."""
    targets = cfg.checkpoints.targets
    if not targets:
        return [skip("offsite targets: none configured")]
    from ..checkpoints.replicate import load_target

    out = []
    for t in targets:
        what = f"offsite target {t.name} ({t.kind})"
        try:
            options = t.options_for(_PROBE_RUN)
            path = dict(t.options).get("path")
            if t.kind == "filesystem" and isinstance(path, str):
                root = listing_root(path)
                if not os.path.isdir(root):
                    out.append(fail(f"{what}: {root} is not a folder", "mount it or fix the target's path"))
                    continue
            load_target(t.kind, options, plugins).list_replicas()
            out.append(ok(f"{what}: reachable, listed"))
        except Exception as exc:
            out.append(fail(f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}",
                            "check the target's options, credentials and network path"))
    return out
