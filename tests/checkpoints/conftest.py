"""Real servers for the replication tests: an sshd on loopback and moto's S3 server."""

from __future__ import annotations

import getpass
import os
import subprocess
from collections.abc import Iterator

import pytest
from ckpt_fixtures import S3Server, SshServer, free_port, wait_port

SSHD = "/usr/sbin/sshd"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """An OpenSSH server on 127.0.0.1 with its own host key and one authorized test key."""
    if not os.path.exists(SSHD):
        pytest.skip("openssh-server is not installed (deploy/install-deps.sh installs it)")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = free_port(22101)
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        "Subsystem sftp internal-sftp\nLogLevel ERROR\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)
    with open(d / "sshd.log", "wb") as log:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_port(port, proc, "sshd")
        base = d / "remote"
        base.mkdir()
        yield SshServer(port, getpass.getuser(), str(d / "client_key"), str(d / "known_hosts"), base)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on loopback (a real HTTP S3 endpoint) with one bucket."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    port = free_port(5055)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")  # noqa: S106 - moto
        client.create_bucket(Bucket="b300-replicas")
        client.close()
        yield S3Server(url, "b300-replicas")
    finally:
        server.stop()
