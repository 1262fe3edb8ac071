"""The world a scenario runs in: Redis, an SQS emulator, a recording SES server, daemon replicas.

One ``redis-server`` and one SQS (fairpost's FIFO-faithful emulator in its own
process, or LocalStack with ``--sqs localstack``) serve the whole bench run; each
scenario gets its own key prefix, its own FIFO queue and its own SES
server, so no scenario sees another's state. Replicas are real ``fairpost
run`` processes (through :mod:`bench.replica`, which counts their AWS calls),
configured only by ``FAIRPOST_*`` variables, as an operator would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import redis

from fairpost.config import Settings
from fairpost.mailer.errors import TimedOut
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import die_with_parent, redis_server, start_fifo_sqs
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for

ROOT = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
AWS_ENV = {
    "AWS_DEFAULT_REGION": REGION,
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
}
_CLK_TCK = os.sysconf("SC_CLK_TCK")
STOP_PATIENCE_SECONDS = 1.0
"""How long past its shutdown grace :meth:`World.stop_replicas` lets a replica go on
stopping before it signals again."""


class BenchError(RuntimeError):
    """The bench could not run a scenario (a service did not start, a replica died)."""


@dataclass(frozen=True)
class Backend:
    """The shared services of one bench run."""

    redis_port: int
    sqs_url: str
    workdir: Path

    def redis_url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/{db}"

    def sqs(self) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.sqs_url,
            region_name=REGION,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )


@contextlib.contextmanager
def services(prefix: str) -> Iterator[Backend]:
    """A part of the bench run alone: its own redis-server, fairpost's SQS (in its own
    process) and a work directory, stopped and removed on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as workdir, redis_server() as server:
        process, sqs_url = start_fifo_sqs(Path(workdir))
        try:
            yield Backend(redis_port=server.port, sqs_url=sqs_url, workdir=Path(workdir))
        finally:
            process.stop()


@dataclass
class Counts:
    """A replica's AWS call counts and CPU time at one moment (see bench.replica)."""

    time: float
    cpu_seconds: float
    calls: dict[str, int]
    received_by_group: dict[str, int]

    def minus(self, earlier: Counts) -> Counts:
        return Counts(
            time=self.time - earlier.time,
            cpu_seconds=self.cpu_seconds - earlier.cpu_seconds,
            calls={k: v - earlier.calls.get(k, 0) for k, v in self.calls.items()},
            received_by_group={
                k: v - earlier.received_by_group.get(k, 0) for k, v in self.received_by_group.items()
            },
        )

    def plus(self, other: Counts) -> Counts:
        calls = dict(self.calls)
        for k, v in other.calls.items():
            calls[k] = calls.get(k, 0) + v
        groups = dict(self.received_by_group)
        for k, v in other.received_by_group.items():
            groups[k] = groups.get(k, 0) + v
        return Counts(max(self.time, other.time), self.cpu_seconds + other.cpu_seconds, calls, groups)

    def sqs_calls(self) -> int:
        return sum(v for k, v in self.calls.items() if k.startswith("sqs."))

    @staticmethod
    def zero() -> Counts:
        return Counts(0.0, 0.0, {}, {})


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    counts_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (from /proc)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def _read_counts(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.counts_path.read_text())
        except (OSError, ValueError):
            return None
        return data

    def snapshot(self, timeout: float = 5.0) -> Counts:
        """Ask the replica for its counts now (SIGUSR1) and wait for them."""
        before = self._read_counts()
        seq = before["seq"] if before else 0
        if self.alive():
            self.process.send_signal(signal.SIGUSR1)
        answer: list[dict[str, Any]] = []

        def answered() -> bool:
            data = self._read_counts()
            if data is not None and (data["seq"] > seq or not self.alive()):
                answer.append(data)
                return True
            return False

        try:
            wait_for(answered, within=timeout, what=f"replica {self.name}'s counts", interval=0.005)
        except TimedOut:
            raise BenchError(f"replica {self.name} gave no counts within {timeout}s") from None
        data = answer[0]
        return Counts(data["time"], data["cpu_seconds"], data["calls"], data["received_by_group"])

    def imported_otel(self) -> bool | None:
        """Whether the replica had imported any of OpenTelemetry at its last counts."""
        data = self._read_counts()
        return None if data is None else bool(data.get("otel_imported"))

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def errors(self) -> list[str]:
        """Log lines at error level (a daemon that logged none ran clean)."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if '"level": "error"' in line or "Traceback" in line:
                    out.append(line[:500])
        return out


@dataclass
class World:
    """One scenario's slice of the backend: key prefix, queue, SES server, replicas."""

    backend: Backend
    name: str
    config: dict[str, Any]
    ses: SesServer
    replicas: list[Replica] = field(default_factory=list)
    queue_url: str = ""

    @property
    def settings(self) -> Settings:
        return Settings(**self.config)

    @property
    def keys(self) -> MailKeys:
        return MailKeys(self.config["key_prefix"])

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRPOST_", "AWS_"))}
        env.update(AWS_ENV)
        env["AWS_ENDPOINT_URL_SQS"] = self.backend.sqs_url
        env["AWS_ENDPOINT_URL_SESV2"] = self.ses.url
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        for name, value in self.config.items():
            var = "FAIRPOST_" + name.upper()
            env[var] = json.dumps(value) if isinstance(value, Mapping) else str(value)
        return env

    def start_replicas(
        self,
        count: int,
        *,
        timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> list[Replica]:
        """``count`` more replicas; ``env``: variables over the world's, ``args``: to ``fairpost run``."""
        env = {**self.env(), **(env or {})}
        started = []
        for i in range(count):
            name = f"{self.name}-{len(self.replicas) + 1}"
            replica_env = dict(env, FAIRPOST_REPLICA_ID=name)
            counts_path = self.backend.workdir / f"{name}.counts.json"
            replica_env["BENCH_COUNTS_FILE"] = str(counts_path)
            log_path = self.backend.workdir / f"{name}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "bench.replica", *args],
                    env=replica_env,
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
            replica = Replica(name, process, log_path, counts_path)
            self.replicas.append(replica)
            started.append(replica)
            del i
        client = redis.Redis.from_url(self.config["redis_url"])
        waiting = list(started)

        def all_beat() -> bool:
            while waiting and client.exists(self.keys.heartbeat(waiting[0].name)):
                waiting.pop(0)
            if waiting and not waiting[0].alive():
                raise BenchError(f"replica {waiting[0].name} exited at start:\n{waiting[0].log_tail()}")
            return not waiting

        try:
            wait_for(all_beat, within=timeout, what="the replicas' first heartbeats", interval=0.05)
        except TimedOut:
            raise BenchError(f"replica {waiting[0].name} did not start:\n{waiting[0].log_tail()}") from None
        finally:
            client.close()
        return started

    def snapshot(self) -> Counts:
        """All replicas' counts summed (taken one after the other, within milliseconds)."""
        total = Counts.zero()
        for replica in self.replicas:
            if replica.alive():
                total = total.plus(replica.snapshot())
        return total

    def stop_replicas(self, grace: float = 20.0) -> dict[str, int]:
        """SIGTERM every replica, and again once its shutdown is past its grace; SIGKILL
        what is left after ``grace``. Returns exit codes.

        Past its grace a stopping daemon hands back what it holds, and waits for the
        long polls it had in flight to land (up to the sender's wait, 20 s by
        default) to hand back what they received: nothing a benchmark measures, as
        the world is torn down next. A second signal makes it exit at once
        (mailer/daemon/app.py); waiting out the polls took 20 s of each world."""
        for replica in self.replicas:
            if replica.alive():
                replica.process.send_signal(signal.SIGTERM)
        codes = {}
        start = time.monotonic()
        patience, deadline = start + self.settings.shutdown_grace + STOP_PATIENCE_SECONDS, start + grace
        for replica in self.replicas:
            code = _exit_code(replica.process, patience)
            if code is None:
                with contextlib.suppress(ProcessLookupError):
                    replica.process.send_signal(signal.SIGTERM)
                code = _exit_code(replica.process, deadline)
            if code is None:
                os.killpg(replica.process.pid, signal.SIGKILL)
                code = replica.process.wait(timeout=10)
            codes[replica.name] = code
        return codes

    def replica_errors(self) -> list[str]:
        return [line for replica in self.replicas for line in replica.errors()]


def _exit_code(process: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The process's exit code once it exits, or None if it still runs at ``deadline`` (monotonic)."""
    try:
        return process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def base_config(backend: Backend, name: str) -> dict[str, Any]:
    """What every scenario's daemons share; scenarios add limits, tenants and tuning."""
    run = uuid.uuid4().hex[:6]
    return {
        "redis_url": backend.redis_url(),
        "key_prefix": f"bench-{name}-{run}",
        "queue_name": f"bench-{name}-{run}.fifo",
        # Shutdown is not measured; an idle sender's long poll would hold it for the whole grace.
        "shutdown_grace": 1,
    }


@contextlib.contextmanager
def world(
    backend: Backend, name: str, config: Mapping[str, Any], *, ses: SesServer | None = None
) -> Iterator[World]:
    """A scenario's world; replicas stopped, queue deleted and keys dropped at the end."""
    full = base_config(backend, name)
    full.update(config)
    server = ses or SesServer()
    with server:
        w = World(backend, name, full, server)
        sqs = backend.sqs()
        w.queue_url, _ = init_queue(sqs, w.settings)
        try:
            yield w
        finally:
            w.stop_replicas()
            with contextlib.suppress(Exception):
                sqs.delete_queue(QueueUrl=w.queue_url)
            client = redis.Redis.from_url(full["redis_url"])
            try:
                client.flushdb()
            finally:
                client.close()


async def sleep_until(deadline: float) -> None:
    """Sleep until the ``time.monotonic()`` deadline."""
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
