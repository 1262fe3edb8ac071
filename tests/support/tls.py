"""Throw-away TLS for real redis-servers: a CA and a certificate it signed for 127.0.0.1
and localhost (made with ``cryptography``), a TLS-only server, and a TLS-only cluster.

Debian's ``redis-server`` is built with TLS: ``--tls-port`` with ``--port 0`` serves
TLS alone; ``--tls-cluster yes`` makes the cluster bus and the addresses ``CLUSTER
SLOTS`` gives TLS too, and ``--tls-replication yes`` the replication links.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.wait import wait_for
from tests.support.topologies import Node


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        return [
            "--tls-cert-file", str(self.cert),
            "--tls-key-file", str(self.key),
            "--tls-ca-cert-file", str(self.ca),
            "--tls-auth-clients", "no",  # server-side TLS, as ElastiCache's in-transit encryption
        ]  # fmt: skip

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, ssl=True, ssl_ca_certs=str(self.ca), socket_timeout=5)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_certs(directory: Path) -> TlsFiles:
    """A CA, and a server certificate it signed for 127.0.0.1 and localhost, valid a day."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_name = _name("fairpost test CA")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return files


def _tls_node(root: Path, name: str, files: TlsFiles, *extra: str) -> Node:
    port = free_port()
    workdir = root / name
    workdir.mkdir()
    argv = [
        _redis_server(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--dir", str(workdir),
        *files.server_args(), *extra,
    ]  # fmt: skip
    return Node(port, workdir, argv)


def _redis_server() -> str:
    path = shutil.which("redis-server")
    assert path is not None, "redis-server is not installed"
    return path


def _answers(files: TlsFiles, port: int) -> bool:
    try:
        with files.client(port) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


@contextmanager
def tls_redis() -> Iterator[tuple[TlsFiles, int]]:
    """A redis-server that speaks TLS only, and the files to trust it."""
    with tempfile.TemporaryDirectory(prefix="fairpost-tls-") as tmp, ExitStack() as stack:
        files = make_certs(Path(tmp))
        node = _tls_node(Path(tmp), "node", files)
        node.start()
        stack.callback(node.stop)
        wait_for(lambda: _answers(files, node.port), within=10, what="the TLS redis-server to answer")
        yield files, node.port


@contextmanager
def tls_cluster(masters: int = 3) -> Iterator[tuple[TlsFiles, list[int]]]:
    """A Redis Cluster over TLS alone (clients and bus): ``masters`` masters, no replicas."""
    with tempfile.TemporaryDirectory(prefix="fairpost-tls-cluster-") as tmp, ExitStack() as stack:
        files = make_certs(Path(tmp))
        nodes = []
        for i in range(masters):
            node = _tls_node(
                Path(tmp), f"node{i}", files,
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(free_port()), "--tls-cluster", "yes", "--tls-replication", "yes",
            )  # fmt: skip
            node.start()
            stack.callback(node.stop)
            nodes.append(node)
        for port in (node.port for node in nodes):
            wait_for(functools.partial(_answers, files, port), within=10, what=f"TLS node {port}")
        cli = shutil.which("redis-cli")
        assert cli is not None
        created = subprocess.run(
            [cli, "--tls", "--cacert", str(files.ca), "--cluster", "create",
             *[f"127.0.0.1:{node.port}" for node in nodes], "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")

        def served() -> bool:
            with files.client(nodes[0].port) as client:
                info = client.execute_command("CLUSTER INFO")
            return bool(info.get("cluster_state") == "ok")

        wait_for(served, within=30, what="every slot served", interval=0.2)
        yield files, [node.port for node in nodes]
