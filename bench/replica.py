"""``fairpost run`` with its AWS calls counted: what the benchmarks start as a replica.

``python -m bench.replica`` runs exactly the daemon (``fairpost.mailer.cli run``) and
changes nothing in it; it only wraps aiobotocore's ``_make_api_call`` to
count every API call by service and operation, and every message that
``ReceiveMessage`` returned by its ``MessageGroupId`` (the tenant). The counts
go, as JSON, to the file named by ``BENCH_COUNTS_FILE``, with the process's
CPU time: at start, on ``SIGUSR1`` (the bench asks for a snapshot at the
edges of a measured interval) and at exit. A wrapped call costs a dictionary
increment. Arguments go to ``fairpost run`` (``--role webhooks``).

With ``BENCH_WITHOUT_OTEL=1`` the process is as if the ``otel`` extra were not
installed: every ``import opentelemetry...`` raises ``ModuleNotFoundError``, as
it does where the package is absent, so the daemon takes its own "not
installed" path (``INSTALLED = False`` in mailer/daemon/tracing.py). The counts
say whether any of OpenTelemetry was imported (``otel_imported``).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import resource
import signal
import sys
import time
from collections import Counter
from types import FrameType
from typing import Any

COUNTS_FILE_VAR = "BENCH_COUNTS_FILE"
WITHOUT_OTEL_VAR = "BENCH_WITHOUT_OTEL"

calls: Counter[str] = Counter()
received_by_group: Counter[str] = Counter()
_seq = 0


def install_counters() -> None:
    from aiobotocore.client import AioBaseClient

    original = AioBaseClient._make_api_call

    async def counted(self: Any, operation_name: str, api_params: Any) -> Any:
        calls[f"{self.meta.service_model.service_name}.{operation_name}"] += 1
        response = await original(self, operation_name, api_params)
        if operation_name == "ReceiveMessage":
            for message in response.get("Messages", ()):
                received_by_group[message.get("Attributes", {}).get("MessageGroupId", "")] += 1
        return response

    AioBaseClient._make_api_call = counted


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Finds ``opentelemetry`` and its submodules nowhere, before any other finder looks."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def dump(path: str) -> None:
    global _seq
    _seq += 1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    data = {
        "seq": _seq,
        "time": time.time(),
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "calls": dict(calls),
        "received_by_group": dict(received_by_group),
        "otel_imported": any(m.split(".")[0] == "opentelemetry" for m in sys.modules),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def main() -> int:
    path = os.environ[COUNTS_FILE_VAR]
    if os.environ.get(WITHOUT_OTEL_VAR) == "1":
        sys.meta_path.insert(0, _NotInstalled())
    install_counters()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        dump(path)

    signal.signal(signal.SIGUSR1, on_usr1)
    dump(path)
    from fairpost.mailer.cli import main as fairpost

    try:
        return fairpost(["run", *sys.argv[1:]])
    finally:
        dump(path)


if __name__ == "__main__":
    sys.exit(main())
