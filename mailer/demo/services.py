"""The demo's private services: a ``redis-server`` and moto's AWS server, and the daemon replicas.

Every process here starts in its own session, so a Ctrl-C in the terminal
reaches only the demo, which then stops them in order: replicas first (they
hand back what they hold to Redis and SQS), then the servers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import redis

from mailer.errors import DemoError

__all__ = [
    "ManagedProcess",
    "demo_env",
    "free_port",
    "replica_ready",
    "start_moto",
    "start_redis",
    "start_replica",
    "stop_all",
]

_STARTUP_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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


def _wait_until(proc: ManagedProcess, ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while not ready():
        if not proc.running():
            raise DemoError(f"{what} exited at start (code {proc.process.returncode}):\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise DemoError(f"{what} did not start within {_STARTUP_TIMEOUT:.0f}s:\n{proc.log_tail()}")
        time.sleep(0.05)


def start_redis(workdir: Path) -> tuple[ManagedProcess, str]:
    """A throwaway ``redis-server`` on a free port: no persistence, files in ``workdir``."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise DemoError(
            "redis-server is not installed (Debian: apt-get install redis-server), "
            "or point FAIRPOST_REDIS_URL at a running Redis"
        )
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(workdir)]
    proc = ManagedProcess("redis-server", argv, workdir / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        _wait_until(proc, pings, "redis-server")
    except BaseException:
        proc.stop()
        raise
    finally:
        client.close()
    return proc, url


def start_moto(workdir: Path) -> tuple[ManagedProcess, str]:
    """moto's server (SQS and SES) in its own process, on a free port."""
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = ManagedProcess("moto", argv, workdir / "moto.log")
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            return False

    try:
        _wait_until(proc, answers, "moto's server")
    except BaseException:
        proc.stop()
        raise
    return proc, url


def start_replica(index: int, workdir: Path, env: Mapping[str, str]) -> ManagedProcess:
    """``fairpost run`` as a real process, as an operator would start it."""
    argv = [sys.executable, "-m", "mailer.cli", "run"]
    return ManagedProcess(f"replica {index}", argv, workdir / f"replica-{index}.log", env)


def replica_ready(proc: ManagedProcess) -> bool:
    try:
        return "fairpost running" in proc.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def demo_env(base: Mapping[str, str], config_file: Path, aws: Mapping[str, str]) -> dict[str, str]:
    """The replicas' environment: the generated config file and nothing else of fairpost's."""
    env = {k: v for k, v in base.items() if not k.startswith("FAIRPOST_")}
    env["FAIRPOST_CONFIG_FILE"] = str(config_file)
    env.update(aws)
    env["PYTHONUNBUFFERED"] = "1"
    # From a source checkout, the replicas run the same code as this process.
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return env
