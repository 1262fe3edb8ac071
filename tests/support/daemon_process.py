"""Run ``fairpost run`` as a real process, as a container would, and talk to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairpost.config import Settings, load_settings
from fairpost.dispatcher.connect import redis_client
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import die_with_parent
from fairpost.mailer.testing.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]


def log_records(logs: str) -> list[dict[str, Any]]:
    """A daemon's log, one record a line: its JSON, or ``{"msg": line}`` for a line
    that is not JSON (a crash's traceback, say)."""
    records = []
    for line in logs.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        # A line that parses as JSON but not as an object (a bare number in a
        # traceback) is no record either.
        records.append(record if isinstance(record, dict) else {"msg": line})
    return records


@dataclass
class DaemonProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    replica: str
    http_port: int | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def logs(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        return log_records(self.logs())

    def logged(self, fragment: str) -> bool:
        return any(fragment in str(r.get("msg", "")) for r in self.log_records())

    def send_signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        assert self.http_port is not None
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@contextmanager
def daemon_process(
    env: Mapping[str, str],
    log_dir: Path,
    *,
    replica: str,
    http_port: int | None = None,
    role: str = "all",
    wait_ready: bool = True,
    python: str = sys.executable,
) -> Iterator[DaemonProcess]:
    """Start ``python -m fairpost.mailer.cli run`` with ``env`` (plus the replica id and port);
    wait for its first heartbeat; SIGKILL it at the end if it still runs. ``python``: another
    release's interpreter (tests/support/release.py), which imports its own fairpost."""
    full_env = dict(env)
    if python == sys.executable and "PYTHONPATH" in os.environ:
        # A worktree's checkout, put first by PYTHONPATH: the daemon runs this code too.
        full_env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
    full_env["FAIRPOST_REPLICA_ID"] = replica
    if http_port is not None:
        full_env["FAIRPOST_HTTP_PORT"] = str(http_port)
    else:
        full_env.pop("FAIRPOST_HTTP_PORT", None)
    log_path = log_dir / f"daemon-{replica}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [python, "-m", "fairpost.mailer.cli", "run", "--role", role],
            env=full_env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(),
        )
    daemon = DaemonProcess(process, log_path, replica, http_port)
    try:
        if wait_ready:
            client = redis_client(_redis_settings(full_env))
            key = MailKeys(full_env.get("FAIRPOST_KEY_PREFIX", "fairpost")).heartbeat(replica)
            try:
                wait_for(
                    lambda: client.exists(key) or process.poll() is not None,
                    within=30,
                    what=f"daemon {replica} to beat",
                )
            finally:
                client.close()
            if process.poll() is not None:
                raise AssertionError(f"daemon {replica} exited with {process.returncode}:\n{daemon.logs()}")
        yield daemon
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _redis_settings(env: Mapping[str, str]) -> Settings:
    """The Redis topology the daemon's environment names (any topology)."""
    prefix = "FAIRPOST_"
    topology = {
        name[len(prefix) :].lower(): value
        for name, value in env.items()
        if name.startswith(prefix + "REDIS_") or name == prefix + "KEY_PREFIX"
    }
    return load_settings(**topology)
