"""Simulated GPU nodes for the drift tests and benchmark: one real sshd each, on loopback.

Each node is a real OpenSSH server (``/usr/sbin/sshd -D``) with its own host
key and its own PATH and LD_LIBRARY_PATH (``SetEnv`` in its sshd_config), so
that the GPU and vendor tools it runs are per-node stand-ins (no GPU exists
here): ``nvidia-smi``, ``nvcc``, ``ofed_info``, ``nv-fabricmanager`` and a
``libnccl.so.2 -> libnccl.so.2.X.Y`` symlink tree. Everything else (``uname``,
``readlink``, ``sha256sum``, the shell, sshd itself) is real.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class Versions:
    driver: str = "580.65.06"
    cuda_driver: str = "13.0"
    gpus: int = 8
    vbios: str = "97.00.88.00.0F"
    cuda: str = "12.9.86"
    nccl: str = "2.23.4"
    ofed: str = "24.10-1.1.4.0"
    fabricmanager: str = "580.65.06"
    hang_s: float = 0.0  # nvidia-smi sleeps this long first (a hung node)
    garbage: bool = False  # nvidia-smi prints what a broken driver prints


@dataclass
class SimNode:
    name: str
    port: int
    root: Path
    versions: Versions
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def host_pub(self) -> str:
        return (self.root / "hostkey.pub").read_text().split()[1]

    def known_hosts_line(self, key_b64: str | None = None) -> str:
        return f"[127.0.0.1]:{self.port} ssh-ed25519 {key_b64 or self.host_pub}\n"

    def set_nccl(self, version: str) -> None:
        """Swap the node's NCCL, as a botched image update would."""
        lib = self.root / "lib"
        (lib / f"libnccl.so.{version}").touch()
        tmp = lib / "libnccl.so.2.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(f"libnccl.so.{version}")
        tmp.replace(lib / "libnccl.so.2")


@dataclass
class Sim:
    """The simulated nodes of a test session, the client key and the known_hosts file."""

    nodes: dict[str, SimNode]
    key: Path
    known_hosts: Path
    base: Path

    def port(self, name: str) -> int:
        return self.nodes[name].port


def client_key(base: Path) -> Path:
    """An ed25519 key pair for the tests' SSH client (created once)."""
    key = base / "client_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "b300-test", "-f", str(key)],
                       check=True, timeout=30)
    return key


def make_node(base: Path, name: str, port: int, versions: Versions, authorized_keys: Path) -> SimNode:
    root = base / name
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "lib").mkdir(exist_ok=True)
    if not (root / "hostkey").exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "hostkey")],
                       check=True, timeout=30)
    v = versions
    _tool(root / "bin" / "nvidia-smi", _nvidia_smi(v))
    release = v.cuda.rsplit(".", 1)[0]
    _tool(root / "bin" / "nvcc", f"echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                                  f"echo 'Cuda compilation tools, release {release}, V{v.cuda}'\n")
    _tool(root / "bin" / "ofed_info", f'[ "$1" = -s ] && echo "MLNX_OFED_LINUX-{v.ofed}:" && exit 0\nexit 1\n')
    _tool(root / "bin" / "nv-fabricmanager", f"echo 'Fabric Manager version is : {v.fabricmanager}'\n")
    node = SimNode(name, port, root, versions)
    node.set_nccl(v.nccl)
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'hostkey'}\nPidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized_keys}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "AllowTcpForwarding yes\nMaxStartups 1000\nLogLevel ERROR\n"
        f"SetEnv PATH={root / 'bin'}:/usr/bin:/bin LD_LIBRARY_PATH={root / 'lib'}\n"
    )
    return node


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n# A stand-in for the vendor tool on a simulated node.\n" + body)
    path.chmod(0o755)


def _nvidia_smi(v: Versions) -> str:
    hang = f"sleep {v.hang_s}\n" if v.hang_s else ""
    per_gpu = ('i=0; while [ $i -lt {n} ]; do echo "{val}"; i=$((i+1)); done; exit 0')
    driver = per_gpu.format(n=v.gpus, val="ERR!" if v.garbage else v.driver)
    return (
        hang
        + 'case "$*" in\n'
        + f"  *driver_version*) {driver} ;;\n"
        + f"  *vbios_version*) {per_gpu.format(n=v.gpus, val=v.vbios)} ;;\n"
        + f'  *query-gpu=index*) i=0; while [ $i -lt {v.gpus} ]; do echo "$i"; i=$((i+1)); done; exit 0 ;;\n'
        + f"  -q) printf '==============NVSMI LOG==============\\n\\nDriver Version : {v.driver}\\n"
        + f"CUDA Version : {v.cuda_driver}\\n'; exit 0 ;;\n"
        + "esac\necho 'unknown arguments' >&2; exit 2\n"
    )


def start(nodes: Iterable[SimNode], timeout: float = 20.0) -> None:
    """Start every node's sshd and wait (bounded) until each accepts connections."""
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    nodes = list(nodes)
    for node in nodes:
        node.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(node.root / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    for node in nodes:
        while not _accepts(node.port):
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(f"sshd of {node.name} exited {node.proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd of {node.name} not listening on {node.port}")
            time.sleep(0.05)


def stop(nodes: Iterable[SimNode]) -> None:
    for node in nodes:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.terminate()
    for node in nodes:
        if node.proc is not None:
            try:
                node.proc.wait(10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(10)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    """A port nothing listens on (for an unreachable node)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fleet(base: Path, versions: Mapping[str, Versions], first_port: int) -> Iterator[Sim]:
    """One running sshd per name in ``versions`` (ports ``first_port``, +1, ... in order), a
    client key they all accept and a known_hosts naming them; every sshd stopped on exit."""
    key = client_key(base)
    auth = base / "authorized_keys"
    auth.write_text(Path(f"{key}.pub").read_text())
    nodes = {name: make_node(base, name, first_port + i, v, auth)
             for i, (name, v) in enumerate(versions.items())}
    known = base / "known_hosts"
    known.write_text("".join(n.known_hosts_line() for n in nodes.values()))
    start(nodes.values())
    try:
        yield Sim(nodes, key, known, base)
    finally:
        stop(nodes.values())


def drift_section(sim: Sim, command_timeout: str = "5s") -> str:
    """A config's ``[drift]`` that reaches ``sim``'s nodes over SSH (partition ``batch``, the
    nccl probe, no scheduled scans): what ``[liveness]`` needs for its confirmation."""
    nodes = "".join(f'{n} = {{ host = "127.0.0.1", port = {node.port}, partition = "batch" }}\n'
                    for n, node in sim.nodes.items())
    return (f"[drift]\nknown_hosts = {json.dumps(str(sim.known_hosts))}\n"
            f"key_file = {json.dumps(str(sim.key))}\ncommand_timeout = {json.dumps(command_timeout)}\n"
            # nccl drift drains (the product's default is warn: a site opts in per probe)
            f'probes = ["nccl"]\n[drift.policy]\nnccl = "drain"\n[drift.nodes]\n{nodes}')
