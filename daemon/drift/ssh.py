"""Run fixed commands on many nodes at once over SSH (paramiko), politely and safely.

One connection per node, all of a node's commands on parallel channels of
it, at most ``concurrency`` nodes at a time. Host keys are checked against
one known_hosts file with paramiko's RejectPolicy: an unknown or changed key
is refused, never learnt. With a jump host every node is reached through
one shared connection to it (``direct-tcpip`` channels, like ``ssh -J``).
A node that cannot be reached, refuses us or does not answer in time gets a
status saying so; it is never reported as having any value.
"""

from __future__ import annotations

import re
import secrets
import select
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import paramiko
import structlog

from .scan_records import CommandResult, Endpoint, NodeRun, NodeStatus, SshSettings

# Endpoint and SshSettings are plain records (drift/scan_records.py, so that reading the
# config needs no paramiko); they are re-exported here, where the SSH users look for them.
__all__ = ["Endpoint", "ParamikoRunner", "SshSettings", "probe_script", "split_output"]
log = structlog.get_logger(__name__)
_MAX_OUTPUT = 1024 * 1024  # per node and stream; nvidia-smi -q on 8 GPUs is ~100 KB
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_TOKEN = re.compile(r"[0-9a-f]{16}")


class ParamikoRunner:
    """Runs named commands on nodes; see the module docstring for the guarantees."""

    def __init__(self, settings: SshSettings, addresses: Mapping[str, Endpoint]) -> None:
        self._settings = settings
        self._addresses = dict(addresses)

    def run(self, nodes: Sequence[str], commands: Mapping[str, str]) -> dict[str, NodeRun]:
        """Every command on every node; one :class:`NodeRun` per node, never an exception."""
        if not nodes:
            return {}
        jump: paramiko.SSHClient | None = None
        if self._settings.jump is not None:
            try:
                jump = self._connect(self._settings.jump, self._settings.jump_user or self._settings.user)
            except _Refused as exc:
                return {n: NodeRun(n, exc.status, f"jump host: {exc}") for n in nodes}
        try:
            workers = max(1, min(self._settings.concurrency, len(nodes)))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="drift-ssh") as pool:
                runs = list(pool.map(lambda n: self._run_node(n, commands, jump), nodes))
        finally:
            if jump is not None:
                jump.close()
        return {r.node: r for r in runs}

    # -- one node ---------------------------------------------------------

    def _run_node(self, node: str, commands: Mapping[str, str],
                  jump: paramiko.SSHClient | None) -> NodeRun:
        address = self._addresses.get(node)
        if address is None:
            return NodeRun(node, NodeStatus.UNREACHABLE, "no SSH address configured")
        try:
            client = self._connect(address, self._settings.user, jump)
        except _Refused as exc:
            log.info("drift.ssh_refused", node=node, status=exc.status.value, error=str(exc))
            return NodeRun(node, exc.status, str(exc))
        try:
            return self._exec_all(node, client, commands)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            return NodeRun(node, NodeStatus.UNREACHABLE, f"connection lost: {exc or type(exc).__name__}")
        finally:
            client.close()

    def _exec_all(self, node: str, client: paramiko.SSHClient, commands: Mapping[str, str]) -> NodeRun:
        transport = client.get_transport()
        assert transport is not None
        deadline = time.monotonic() + self._settings.command_timeout_s
        # One session runs every probe in turn: one remote shell start per node
        # (login shells can take a second), and within OpenSSH's MaxSessions.
        token = secrets.token_hex(8)
        chan = transport.open_session(timeout=self._settings.connect_timeout_s)
        try:
            chan.exec_command(probe_script(commands, token))
            out, err, finished = _read_until_exit(chan, deadline)
        finally:
            chan.close()
        return NodeRun(node, NodeStatus.OK, "", split_output(commands, token, out, err, finished))

    def _connect(self, address: Endpoint, user: str,
                 jump: paramiko.SSHClient | None = None) -> paramiko.SSHClient:
        s = self._settings
        client = paramiko.SSHClient()
        try:
            # Only our known_hosts file, never ~/.ssh/known_hosts; unknown keys are refused.
            client.load_host_keys(s.known_hosts)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            sock: paramiko.Channel | None = None
            if jump is not None:
                jt = jump.get_transport()
                if jt is None or not jt.is_active():
                    raise _Refused(NodeStatus.UNREACHABLE, "jump host connection lost")
                sock = jt.open_channel("direct-tcpip", (address.host, address.port), ("127.0.0.1", 0),
                                       timeout=s.connect_timeout_s)
            client.connect(
                address.host, port=address.port, username=user, key_filename=s.key_file,
                allow_agent=s.key_file is None, look_for_keys=False, timeout=s.connect_timeout_s,
                banner_timeout=s.connect_timeout_s, auth_timeout=s.connect_timeout_s,
                channel_timeout=s.connect_timeout_s, sock=sock,
            )
            return client
        except _Refused:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise _Refused(NodeStatus.HOSTKEY, f"host key CHANGED for {exc.hostname}; refused") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise _Refused(NodeStatus.AUTH, f"authentication failed: {exc}") from None
        except paramiko.SSHException as exc:
            client.close()
            text = str(exc)
            if "known_hosts" in text:  # RejectPolicy: no key on file for this host
                raise _Refused(NodeStatus.HOSTKEY, "host key not in known_hosts; refused") from None
            status = NodeStatus.TIMEOUT if "timeout" in text.lower() else NodeStatus.UNREACHABLE
            raise _Refused(status, text or type(exc).__name__) from None
        except TimeoutError:
            client.close()
            raise _Refused(NodeStatus.UNREACHABLE, "connect timed out") from None
        except (OSError, EOFError) as exc:
            client.close()
            raise _Refused(NodeStatus.UNREACHABLE, str(exc) or type(exc).__name__) from None


class _Refused(Exception):
    def __init__(self, status: NodeStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def probe_script(commands: Mapping[str, str], token: str) -> str:
    """One shell script running each command in a subshell between marker lines.

    Names must match ``[a-z][a-z0-9_]*`` and the token is hex, so neither can
    change the script; the commands are the probes' own fixed text.
    """
    parts = []
    for name, command in commands.items():
        if not _NAME.fullmatch(name) or not _TOKEN.fullmatch(token):
            raise ValueError(f"bad probe name {name!r}")
        mark = f"@@b300:{token}"
        parts.append(f"printf '%s\\n' '{mark}:begin:{name}'; printf '%s\\n' '{mark}:begin:{name}' >&2; "
                     f"( {command}\n) </dev/null; rc=$?; printf '\\n%s:%s\\n' '{mark}:end:{name}' \"$rc\"; "
                     f"printf '\\n%s\\n' '{mark}:end:{name}' >&2")
    return "\n".join(parts) + "\n"


def split_output(commands: Mapping[str, str], token: str, out: str, err: str,
                 finished: bool) -> dict[str, CommandResult]:
    """Each command's result from the script's marked output; unfinished ones get exit_code None."""
    mark = f"@@b300:{token}:"
    stdout, codes = _sections(out, mark, with_code=True)
    stderr, _ = _sections(err, mark, with_code=False)
    results = {}
    for name in commands:
        code = codes.get(name)
        results[name] = CommandResult(code, stdout.get(name, ""), stderr.get(name, ""))
    return results


def _sections(text: str, mark: str, *, with_code: bool) -> tuple[dict[str, str], dict[str, int]]:
    bodies: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    current: str | None = None
    for line in text.split("\n"):
        if line.startswith(mark):
            what, _, rest = line[len(mark):].partition(":")
            if what == "begin":
                current = rest
                bodies[current] = []
            elif what == "end":
                name, _, code = rest.partition(":")
                if with_code and code.lstrip("-").isdigit():
                    codes[name] = int(code)
                if name in bodies and bodies[name] and bodies[name][-1] == "":
                    bodies[name].pop()  # the newline the end marker adds
                current = None
            continue
        if current is not None:
            bodies[current].append(line)
    return {k: "\n".join(v) for k, v in bodies.items()}, codes


def _read_until_exit(chan: paramiko.Channel, deadline: float) -> tuple[str, str, bool]:
    """Read stdout and stderr until the command exits (True) or the deadline passes (False)."""
    out, err = bytearray(), bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _text(out), _text(err), False
        # A channel is readable when stdout data or EOF arrives; stderr is checked each tick.
        select.select([chan], [], [], min(remaining, 0.25))
        while chan.recv_ready():
            data = chan.recv(65536)
            if len(out) < _MAX_OUTPUT:
                out += data
        while chan.recv_stderr_ready():
            data = chan.recv_stderr(65536)
            if len(err) < _MAX_OUTPUT:
                err += data
        # sshd may send the exit status before the last output: wait for EOF as well.
        if (chan.exit_status_ready() and (chan.eof_received or chan.closed)
                and not chan.recv_ready() and not chan.recv_stderr_ready()):
            return _text(out), _text(err), True


def _text(data: bytearray) -> str:
    return bytes(data[:_MAX_OUTPUT]).decode("utf-8", errors="replace")


