"""``fairpost run`` with its AWS calls counted: what the benchmarks start as a replica.

``python -m bench.replica`` runs exactly the daemon (``fairpost.mailer.cli run``) and
changes nothing in it; it only wraps aiobotocore's ``_make_api_call`` to
count every API call by service and operation, and every message that
``ReceiveMessage`` returned by its ``MessageGroupId`` (the tenant). The counts
go, as JSON, to the file named by ``BENCH_COUNTS_FILE``, with the process's
CPU time: at start, on ``SIGUSR1`` (the bench asks for a snapshot at the
edges of a measured interval) and at exit. A wrapped call costs a dictionary
increment.
"""

from __future__ import annotations

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
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def main() -> int:
    path = os.environ[COUNTS_FILE_VAR]
    install_counters()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        dump(path)

    signal.signal(signal.SIGUSR1, on_usr1)
    dump(path)
    from fairpost.mailer.cli import main as fairpost

    try:
        return fairpost(["run"])
    finally:
        dump(path)


if __name__ == "__main__":
    sys.exit(main())
