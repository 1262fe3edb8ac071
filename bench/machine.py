"""What the figures ran on: CPU, cores, memory, Python, Redis and the emulators."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _redis_version() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        return "not installed"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe(sqs: str = "fifo") -> dict[str, Any]:
    """The machine and what the bench ran on (``sqs``: the ``--sqs`` choice)."""
    emulator = "LocalStack 4.12.0 (host mode)" if sqs == "localstack" else "fairpost's FIFO-faithful SQS"
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "redis": _redis_version(),
        "sqs_emulator": emulator,
        "packages": {p: _version(p) for p in ("aioboto3", "aiobotocore", "redis", "limits")},
    }


def summary(machine: dict[str, Any]) -> str:
    return (
        f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, {machine['os']}; "
        f"Python {machine['python']}, Redis {machine['redis']}, {machine['sqs_emulator']}"
    )
