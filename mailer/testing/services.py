"""A throw-away ``redis-server`` and moto's AWS server on free ports, and the child processes they run in.

The demo runs both as processes in sessions of their own (a Ctrl-C in the
terminal reaches only the demo, which then stops them in order); the tests
run one ``redis-server`` for the whole session and moto in a thread of the
test process (the SQS contract tests need its receives to interleave with
theirs, see tests/contract/test_sqs_fifo.py).

Every server started here (and LocalStack, the benchmarks' replicas, the test
topologies' nodes) gets SIGTERM from Linux when its parent dies, through
:func:`die_with_parent`: a demo, bench or pytest run that is killed outright
leaves no server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis

from fairpost.mailer.errors import ServiceError, TimedOut
from fairpost.mailer.testing.sqs_server import SqsServer
from fairpost.mailer.testing.wait import wait_for

__all__ = [
    "ManagedProcess",
    "MotoServer",
    "RedisServer",
    "die_with_parent",
    "fifo_sqs_server",
    "free_port",
    "moto_server",
    "redis_server",
    "start_moto",
    "start_redis",
    "stop_all",
]

STARTUP_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _linux_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    fn: Callable[..., int] = prctl
    return fn


_prctl = _linux_prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets SIGTERM when its parent dies.

    Linux's ``PR_SET_PDEATHSIG``, set in the child between fork and exec (it
    survives the exec). It is what ends a server whose parent was SIGKILLed and
    so could not stop it. None elsewhere (Popen then runs nothing): servers can
    outlive a killed parent there.

    Linux fires it when the *thread* that started the child ends, not the
    process, so it is armed only for children the main thread starts: a child
    started from another thread (the failover tests restart a killed node from
    one) would die with that thread. Those can outlive a killed parent.
    """
    if _prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl = _prctl
    parent = os.getpid()

    def set_pdeathsig() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return  # not fatal: the child runs, as it would off Linux
        if os.getppid() != parent:
            # The parent died before the signal was armed: it will never come.
            os._exit(1)

    return set_pdeathsig


class ManagedProcess:
    """A child process whose output goes to a log file; :meth:`stop` is idempotent."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def wait(self, deadline: float) -> bool:
        """Wait until the process exits or the monotonic ``deadline``; True if it exited."""
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it is still running after ``grace`` seconds."""
        stop_all([self], grace)

    def wait_started(self, ready: Callable[[], bool], within: float = STARTUP_TIMEOUT) -> None:
        """Wait until ``ready()``; :class:`ServiceError` with the log's tail if it exits or takes too long."""

        def started() -> bool:
            if not self.running():
                raise ServiceError(
                    f"{self.name} exited at start (code {self.process.returncode}):\n{self.log_tail()}"
                )
            return ready()

        try:
            wait_for(started, within=within, what=f"{self.name} to start", interval=0.05)
        except TimedOut:
            raise ServiceError(
                f"{self.name} did not start within {within:.0f}s:\n{self.log_tail()}"
            ) from None


def stop_all(processes: list[ManagedProcess], grace: float) -> list[ManagedProcess]:
    """SIGTERM every process, wait up to ``grace`` seconds, SIGKILL the rest; returns those killed."""
    for proc in processes:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    killed = []
    for proc in processes:
        if not proc.wait(deadline):
            proc.signal(signal.SIGKILL)
            proc.wait(time.monotonic() + 5)
            killed.append(proc)
    return killed


# -- redis-server ----------------------------------------------------------------------------


def start_redis(workdir: Path, *options: str) -> tuple[ManagedProcess, str]:
    """A ``redis-server`` on a free port of 127.0.0.1, no persistence, files in ``workdir``; and its URL.
    ``options``: more of redis-server's arguments (``--maxmemory``, ``4mb``...)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServiceError("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(workdir), *options]
    proc = ManagedProcess("redis-server", argv, workdir / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        proc.wait_started(pings)
    except BaseException:
        proc.stop()
        raise
    finally:
        client.close()
    return proc, url


@dataclass(frozen=True)
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"


@contextmanager
def redis_server(*options: str) -> Iterator[RedisServer]:
    """:func:`start_redis` in a temporary directory, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="fairpost-redis-") as workdir:
        proc, url = start_redis(Path(workdir), *options)
        try:
            yield RedisServer(port=urlsplit(url).port or 0, process=proc.process)
        finally:
            proc.stop(grace=10)


# -- moto ------------------------------------------------------------------------------------


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/moto-api/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


def start_moto(workdir: Path) -> tuple[ManagedProcess, str]:
    """moto's server (SQS and SES) in its own process, on a free port; and its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = ManagedProcess("moto's server", argv, workdir / "moto.log")
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_started(lambda: _answers(url))
    except BaseException:
        proc.stop()
        raise
    return proc, url


def start_fifo_sqs(workdir: Path) -> tuple[ManagedProcess, str]:
    """fairpost's FIFO-faithful SQS (sqs_server.py) in its own process, on a free port; and its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "fairpost.mailer.testing.sqs_server", "--port", str(port)]
    proc = ManagedProcess("SQS server", argv, workdir / "sqs.log")
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_started(lambda: _answers(url))
    except BaseException:
        proc.stop()
        raise
    return proc, url


@dataclass(frozen=True)
class MotoServer:
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Forget every queue, message and sent mail."""
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


# -- fairpost's own SQS ----------------------------------------------------------------------


@contextmanager
def fifo_sqs_server() -> Iterator[SqsServer]:
    """The FIFO-faithful SQS (mailer/testing/sqs_server.py) in a thread of this process, over HTTP."""
    with SqsServer() as server:
        yield server
