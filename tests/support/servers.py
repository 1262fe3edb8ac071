"""Start real servers for the tests: redis-server and moto's AWS server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="fairpost-redis-") as workdir:
        port = free_port()
        process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
                "--logfile",
                str(Path(workdir) / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(port=port)
            wait_until(lambda: _pings(client), timeout=10, what="redis-server to answer PING")
            client.close()
            yield RedisServer(port=port, process=process)
        finally:
            process.terminate()
            process.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def wait_until(predicate: Callable[[], object], *, timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True)
class MotoServer:
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Forget every queue, message and sent mail."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(self.url + "/moto-api/reset", method="POST")).close()


@contextmanager
def moto_server() -> Iterator[MotoServer]:
    """moto's server in a thread of this process, reached over HTTP like AWS."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield MotoServer(port=port)
    finally:
        server.stop()
