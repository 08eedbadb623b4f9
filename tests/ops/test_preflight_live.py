"""``b300d --check-config``, ``--version`` and ``b300ctl submit --dry-run`` against real services.

The local Slurm cluster, real sshd nodes (tests/drift/drift_nodes.py), a real SMTP
server (aiosmtpd, STARTTLS and AUTH), SQLite and a PostgreSQL URL nothing listens on.
Each check is run as the operator runs it: ``python -m b300.app.main`` in its own process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import shutil
import sqlite3
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from helpers import slurm_cmd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drift"))
import drift_nodes as dn
from drift_nodes import Sim, Versions

pytestmark = pytest.mark.slurm
# Beside the drift (+0..5) and liveness (+40..) suites' sshd ports.
SSH_PORT = int(os.environ.get("B300_SSHD_PORT_BASE", "22201")) + 70
NOBODY = 65534


def _b300d(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "b300.app.main", *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env)


def _lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return proc.stdout.splitlines()


def _failed(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in _lines(proc) if line.startswith("FAIL")]


def _config(base: Path, slurm_conf: str, *, db: str = "", bin_dir: str = "", extra: str = "") -> Path:
    state = base / "state"
    cfg = base / "b300.toml"
    cfg.write_text(
        "[daemon]\n"
        f"state_dir = {json.dumps(str(state))}\n"
        + (f"database_url = {json.dumps(db)}\n" if db else "")
        + f"job_log_dir = {json.dumps(str(base / 'logs'))}\n"
        "[slurm]\n"
        f"conf = {json.dumps(slurm_conf)}\n"
        + (f"bin_dir = {json.dumps(bin_dir)}\n" if bin_dir else "")
        + extra)
    cfg.chmod(0o644)
    return cfg


def _migrate(url: str, revision: str = "heads") -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("b300.sql")))
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, revision)


def _revision(db: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return {r[0] for r in conn.execute("SELECT version_num FROM alembic_version")}


# -- a real SMTP server ------------------------------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "smtp.crt", tmp / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope)
        return "250 OK"


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[tuple[_Inbox, str]]:
    """A real SMTP server on loopback requiring STARTTLS, then AUTH as b300/s3cret; yields its
    inbox and the config's [report] table (the password file holding the right password)."""
    cert, key = _self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    inbox = _Inbox()

    def authenticator(_server: Any, _session: Any, _envelope: Any, _mechanism: str, data: Any) -> AuthResult:
        # handled=False: a refusal is answered with 535 (True would leave the answer to us).
        return AuthResult(success=isinstance(data, LoginPassword)
                          and (data.login, data.password) == (b"b300", b"s3cret"), handled=False)

    port = dn.free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, tls_context=tls, require_starttls=True,
                            authenticator=authenticator, auth_required=True, auth_require_tls=True)
    controller.start()
    password = tmp_path / "smtp.pass"
    password.write_text("s3cret\n")
    password.chmod(0o600)
    try:
        yield inbox, ("[report]\nto = [\"ops@example.com\"]\nsmtp_host = \"127.0.0.1\"\n"
                      f"smtp_port = {port}\nsmtp_user = \"b300\"\npassword_file = {json.dumps(str(password))}\n"
                      f"ca_file = {json.dumps(str(cert))}\nstarttls = true\n")
    finally:
        controller.stop()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Sim]:
    base = tmp_path / "nodes"
    base.mkdir()
    with dn.fleet(base, {"gpu01": Versions(), "gpu02": Versions()}, SSH_PORT) as sim:
        yield sim


# -- --check-config ------------------------------------------------------------------


def test_everything_passes_and_nothing_is_touched(tmp_path: Path, slurm_conf: str, nodes: Sim,
                                                  smtp: tuple[_Inbox, str]) -> None:
    inbox, report = smtp
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    db = state / "state.db"
    _migrate(f"sqlite:///{db}")
    offsite = tmp_path / "offsite"
    offsite.mkdir()
    roots = tmp_path / "ckpt"
    roots.mkdir()
    extra = (f"[checkpoints]\nroots = [{json.dumps(str(roots))}]\n"
             f"[[checkpoints.targets]]\nname = \"b\"\nkind = \"filesystem\"\n"
             f"path = {json.dumps(str(offsite) + '/{run}')}\n"
             + report + dn.drift_section(nodes))
    cfg = _config(tmp_path, slurm_conf, extra=extra)
    before = sorted(p.name for p in state.iterdir())
    proc = _b300d("--config", str(cfg), "--check-config")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _failed(proc) == []
    text = proc.stdout
    for expected in (f"ok   config {cfg}: parses",
                     "mode: observe (not set: the default): records, alerts, reports; acts on nothing",
                     f"state_dir {state}: writable by root",
                     f"checkpoint root {roots}: writable by root", "plugins b300.slurm_backends: cli",
                     "Slurm release 22.05", "Slurm controller answers (SLURM_CONF=",
                     "is UP; sinfo lists 4 nodes",
                     "Slurm backend cli ([slurm] backend = cli): configured",
                     "schema at head 0301", "node-down trigger ([recovery] node_trigger): running as root",
                     "SSH as root to all 2 [drift] nodes: host keys verified, authenticated, ran true",
                     "connected, STARTTLS, logged in as b300, quit without sending",
                     "offsite target b (filesystem): reachable, listed"):
        assert expected in text, text
    assert all(line[:5] in ("ok   ", "skip ") for line in _lines(proc))
    # Acted on nothing: no socket, lock or trigger program; no migration; no mail; no trigger.
    assert sorted(p.name for p in state.iterdir()) == before
    assert not (tmp_path / "logs").exists() and list(offsite.iterdir()) == []
    assert inbox.messages == []
    assert str(state) not in slurm_cmd(slurm_conf, "strigger", "--get")


def test_a_config_that_does_not_parse_is_one_line_and_2(tmp_path: Path) -> None:
    cfg = tmp_path / "b300.toml"
    cfg.write_text("[daemon]\npoll_interval = \"soon\"\n")
    proc = _b300d("--config", str(cfg), "--check-config")
    assert proc.returncode == 2
    (line,) = _lines(proc)
    assert line.startswith("FAIL config: ") and "poll_interval" in line


def test_database_behind_head_would_migrate_and_is_not_migrated(tmp_path: Path, slurm_conf: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    db = state / "state.db"
    _migrate(f"sqlite:///{db}", "0002")
    assert _revision(db) == {"0002"}
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf)), "--check-config")
    assert proc.returncode == 0, proc.stdout
    assert f"ok   database sqlite:///{db}: would migrate from 0002 to 0301 at start" in _lines(proc)
    assert _revision(db) == {"0002"}  # still: the check migrated nothing


@pytest.mark.postgres
def test_postgresql_behind_head_would_migrate_and_is_not_migrated(tmp_path: Path, slurm_conf: str,
                                                                   pg_url: str) -> None:
    import sqlalchemy as sa

    def revision() -> set[str]:
        engine = sa.create_engine(pg_url)
        try:
            with engine.connect() as conn:
                return {str(r) for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))
                        .scalars()}
        finally:
            engine.dispose()

    _migrate(pg_url, "0101")
    assert revision() == {"0101"}
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf, db=pg_url)), "--check-config")
    assert proc.returncode == 0, proc.stdout
    assert f"ok   database {pg_url}: would migrate from 0101 to 0301 at start" in _lines(proc)
    assert revision() == {"0101"}


def test_database_newer_than_this_code_fails(tmp_path: Path, slurm_conf: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    db = state / "state.db"
    _migrate(f"sqlite:///{db}")
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE alembic_version SET version_num = '0999'")
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf)), "--check-config")
    assert proc.returncode == 1
    assert _failed(proc) == [f"FAIL database sqlite:///{db}: schema revision 0999 is newer than this b300 "
                             "(its head is 0301) -- the database was migrated by a newer b300: upgrade "
                             "this one"]


def test_an_unreachable_database_fails(tmp_path: Path, slurm_conf: str) -> None:
    url = f"postgresql+psycopg://b300@127.0.0.1:{dn.free_port()}/test"  # nothing listens there
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf, db=url)), "--check-config")
    assert proc.returncode == 1
    (line,) = _failed(proc)
    assert line.startswith(f"FAIL database {url}: not reachable: OperationalError")
    assert "check [daemon] database_url" in line


def test_missing_slurm_tools_fail(tmp_path: Path, slurm_conf: str) -> None:
    empty = tmp_path / "no-slurm"
    empty.mkdir()
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf, bin_dir=str(empty))), "--check-config")
    assert proc.returncode == 1
    assert _failed(proc) == [f"FAIL Slurm tools: sbatch, squeue, sacct, sinfo, scontrol, scancel, strigger "
                             f"not found in {empty} -- install the Slurm client tools or set [slurm] bin_dir "
                             "to their folder"]


def test_admin_group_must_exist(tmp_path: Path, slurm_conf: str) -> None:
    cfg = _config(tmp_path, slurm_conf)
    text = cfg.read_text().replace("[daemon]\n", "[daemon]\nadmin_group = \"b300-no-such-group\"\n")
    cfg.write_text(text)
    proc = _b300d("--config", str(cfg), "--check-config")
    assert proc.returncode == 1
    assert _failed(proc) == ["FAIL admin_group b300-no-such-group: no such group: only root and the daemon's "
                             "user could change things through b300ctl -- groupadd b300-no-such-group, or "
                             "fix [daemon] admin_group"]
    cfg.write_text(text.replace("b300-no-such-group", "root"))
    proc = _b300d("--config", str(cfg), "--check-config")
    assert proc.returncode == 0 and "ok   admin_group root: exists" in proc.stdout


def test_an_offsite_folder_that_is_not_there_fails(tmp_path: Path, slurm_conf: str) -> None:
    gone = tmp_path / "not-mounted"
    extra = (f"[[checkpoints.targets]]\nname = \"b\"\nkind = \"filesystem\"\n"
             f"path = {json.dumps(str(gone) + '/{run}')}\n")
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf, extra=extra)), "--check-config")
    assert proc.returncode == 1
    assert _failed(proc) == [f"FAIL offsite target b (filesystem): {gone} is not a folder -- mount it or fix "
                             "the target's path"]


def test_a_changed_host_key_fails_that_node(tmp_path: Path, slurm_conf: str, nodes: Sim) -> None:
    # gpu02's entry holds gpu01's key: what a reinstalled node or a man in the middle looks like.
    a, b = nodes.nodes["gpu01"], nodes.nodes["gpu02"]
    nodes.known_hosts.write_text(a.known_hosts_line() + b.known_hosts_line(a.host_pub))
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf, extra=dn.drift_section(nodes))),
                  "--check-config")
    assert proc.returncode == 1
    (line,) = _failed(proc)
    assert "@gpu02: hostkey: host key CHANGED" in line and f"fix {nodes.known_hosts}" in line


def test_a_wrong_smtp_password_fails_at_login(tmp_path: Path, slurm_conf: str,
                                              smtp: tuple[_Inbox, str]) -> None:
    inbox, report = smtp
    (tmp_path / "smtp.pass").write_text("wrong\n")
    proc = _b300d("--config", str(_config(tmp_path, slurm_conf, extra=report)), "--check-config")
    assert proc.returncode == 1
    (line,) = _failed(proc)
    assert line.startswith("FAIL SMTP 127.0.0.1:") and ": login failed: SMTPAuthenticationError" in line
    assert "check smtp_user and the password in password_file" in line
    assert inbox.messages == []


def test_a_folder_the_service_user_cannot_write_fails(tmp_path: Path, slurm_conf: str) -> None:
    """As user nobody: the state folder is root's (0755), the job log folder nobody's."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as user nobody")
    shared = Path(tempfile.mkdtemp(prefix="b300-check-"))
    try:
        shared.chmod(0o755)
        (shared / "state").mkdir(mode=0o755)
        (shared / "logs").mkdir()
        os.chown(shared / "logs", NOBODY, NOBODY)
        cfg = _config(shared, slurm_conf)
        # The check's own code in a process of user nobody: it runs once as root first so that
        # everything it imports is loaded (the interpreter's files are under /root, 0700 here),
        # then drops to nobody for good and runs again.
        code = ("import contextlib, io, os, sys\nfrom b300.app.main import main\n"
                "with contextlib.redirect_stdout(io.StringIO()):\n    main(sys.argv[1:])\n"
                f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
                f"assert os.getuid() == os.geteuid() == {NOBODY}\n"
                "sys.exit(main(sys.argv[1:]))\n")
        proc = subprocess.run([sys.executable, "-c", code, "--config", str(cfg), "--check-config"],
                              capture_output=True, text=True, timeout=120, check=False)
        lines = _lines(proc)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert (f"FAIL state_dir {shared / 'state'}: not writable by nobody -- chown nobody "
                f"{shared / 'state'} (or run b300d as its owner)") in lines, proc.stdout
        assert f"ok   job_log_dir {shared / 'logs'}: writable by nobody (created and deleted a file)" in lines
        assert list((shared / "logs").iterdir()) == []
        # SlurmUser is root on the local cluster: nobody may not arm the node-down trigger.
        assert ("FAIL node-down trigger ([recovery] node_trigger): nobody is neither root nor SlurmUser "
                "(root): strigger --set would be refused -- run b300d as root, or set [recovery] "
                "node_trigger = false (the daemon then finds down nodes by polling alone)") in lines, \
            proc.stdout
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# -- --version ---------------------------------------------------------------------------


def test_version_needs_no_config_and_no_slurm(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "B300_CONFIG": str(tmp_path / "missing.toml"), "HOME": str(tmp_path)}
    want = metadata.version("b300-orchestrator")
    for program, module in (("b300d", "b300.app.main"), ("b300ctl", "b300.cli")):
        proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                              timeout=60, check=False, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [f"{program} {want}", "state store schema 0301"]


def test_help_lists_the_new_options() -> None:
    daemon_help = _b300d("--help").stdout
    assert "--check-config" in daemon_help and "--version" in daemon_help
    ctl = [sys.executable, "-m", "b300.cli"]
    assert "--version" in subprocess.run([*ctl, "--help"], capture_output=True, text=True, timeout=60,
                                         check=True).stdout
    assert "--dry-run" in subprocess.run([*ctl, "submit", "--help"], capture_output=True, text=True,
                                         timeout=60, check=True).stdout


# -- submit --dry-run --------------------------------------------------------------------


def test_submit_dry_run_names_exclusions_and_resume_point_and_submits_nothing(
        tmp_path: Path, slurm_conf: str, nodes: Sim) -> None:
    from b300.drift.scan_records import Finding, FindingKind, Policy
    from b300.events import Kind
    from b300.interfaces import NewEvent
    from b300.slurm.cli import CliSlurmClient
    from b300.store import open_store

    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    url = f"sqlite:///{state / 'state.db'}"
    now = dt.datetime.now(dt.UTC)
    with open_store(url) as store:
        store.sync_nodes(CliSlurmClient(slurm_conf=slurm_conf).nodes(), now)
        store.drift.record_scan(now, now, 2, {}, [Finding("gpu02", "nccl", FindingKind.DRIFT, "2.23.4",
                                                          "2.21.5", Policy.DRAIN)], [])
        for run in ("r1", "r2", "r3"):  # gpu03 failed three runs today: a black hole
            store.create_run(run, run, 'name = "x"\n[job]\ncommand = "true"\nnodes = 1\n', now)
            store.append_events([NewEvent(Kind.NODE_FAILED, run_id=run, node="gpu03",
                                          data={"outcome": "INFRA"})], now)
        runs_before, events_before = store.list_runs(), store.events()
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_10").mkdir(parents=True)
    (ckpt / "step_10" / "DONE").touch()
    (ckpt / "step_20").mkdir()  # no DONE marker: incomplete, not a resume point
    spec = tmp_path / "llama.toml"
    spec.write_text("\n".join([
        'name = "dryrun-llama"', "[job]", 'command = "srun true --resume {resume_from}"', "nodes = 2",
        "gpus_per_node = 0", "[checkpoint]", f"dir = {json.dumps(str(ckpt))}", 'layout = "generic"']) + "\n")
    cfg = _config(tmp_path, slurm_conf, extra=dn.drift_section(nodes))
    ctl = [sys.executable, "-m", "b300.cli", "--config", str(cfg), "submit", "--dry-run"]
    proc = subprocess.run([*ctl, str(spec)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "nothing submitted, nothing recorded" in out
    assert "exclude: gpu02 (open drift finding)" in out
    assert "black-hole nodes: gpu03 (failed runs r1, r2, r3)" in out
    assert f"resume point: {ckpt / 'step_10'} (newest verified checkpoint in {ckpt}" in out
    sbatch = next(line for line in out.splitlines() if line.startswith("sbatch command"))
    assert "--exclude=gpu02" in sbatch and "--nodes=2" in sbatch and "--job-name=b300-dryrun-llama-" in sbatch
    assert "export B300_CHECKPOINT_DIR=" in out
    # Nothing in Slurm's queue, nothing in the store.
    assert "dryrun-llama" not in slurm_cmd(slurm_conf, "squeue", "--noheader", "--states=all", "--format=%j")
    with open_store(url) as store:
        assert store.list_runs() == runs_before and store.events() == events_before

    as_json = json.loads(subprocess.run([*ctl, "--json", str(spec)], capture_output=True, text=True,
                                        timeout=120, check=True).stdout)
    assert as_json["exclude"] == [{"node": "gpu02", "why": "open drift finding"}]
    assert as_json["resume_from"] == str(ckpt / "step_10") and as_json["sbatch_argv"][0] == "sbatch"

    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[job]\nnodes = 0\n')
    proc = subprocess.run([*ctl, str(bad)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("b300ctl: ")
