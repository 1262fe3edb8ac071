"""The demo's private services: a ``redis-server``, fairpost's SQS, and the daemon replicas.

Servers start through :mod:`fairpost.mailer.testing.services`, as in the tests and the benchmarks.

Every process here starts in its own session, so a Ctrl-C in the terminal
reaches only the demo, which then stops them in order: replicas first (they
hand back what they hold to Redis and SQS), then the servers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from fairpost.mailer.errors import DemoError, ServiceError
from fairpost.mailer.testing import services
from fairpost.mailer.testing.services import ManagedProcess, stop_all

__all__ = [
    "ManagedProcess",
    "demo_env",
    "replica_ready",
    "start_fifo_sqs",
    "start_redis",
    "start_replica",
    "stop_all",
]


def start_redis(workdir: Path) -> tuple[ManagedProcess, str]:
    """The demo's private ``redis-server``; the error says how to use one's own instead."""
    try:
        return services.start_redis(workdir)
    except ServiceError as exc:
        raise DemoError(f"{exc}\n(or point FAIRPOST_REDIS_URL at a running Redis)") from None


def start_fifo_sqs(workdir: Path) -> tuple[ManagedProcess, str]:
    """The demo's private SQS (fairpost's FIFO-faithful emulator)."""
    try:
        return services.start_fifo_sqs(workdir)
    except ServiceError as exc:
        raise DemoError(f"{exc}\n(or set AWS_ENDPOINT_URL to an emulator of your own)") from None


def start_replica(index: int, workdir: Path, env: Mapping[str, str]) -> ManagedProcess:
    """``fairpost run`` as a real process, as an operator would start it."""
    argv = [sys.executable, "-m", "fairpost.mailer.cli", "run"]
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
