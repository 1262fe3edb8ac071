"""``python -m bench``: run every benchmark, print the table, write the JSON.

Exit status: 0 when every safety figure (quota windows, lost and duplicated
mail) holds, 1 when one fails (each failing figure is named on stderr), 2
when the bench itself could not run. The other targets are reported, never
turned into an exit status: machines differ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench import (
    fairshare,
    finished_memory,
    isolation,
    machine,
    outcomes,
    pool_shards,
    quota_engine,
    safety,
    scale,
    strategies,
    streams,
    throughput,
    tracing,
)
from bench.cluster import Backend
from bench.figures import Figure, markdown_table, table
from fairpost.mailer.testing.localstack import localstack_server
from fairpost.mailer.testing.services import redis_server, start_fifo_sqs

RESULTS = Path(__file__).resolve().parent / "results"
Scenario = Callable[[Backend, bool], Coroutine[Any, Any, list[Figure]]]

SCENARIOS: dict[str, Scenario] = {
    "quota_engine": quota_engine.run,
    "safety": safety.run,
    "isolation": isolation.run,
    "streams": streams.run,
    "fairshare": fairshare.run,
    "throughput": throughput.run,
    "strategies": strategies.run,
    "scale": scale.run,
    "tracing": tracing.run,
    "outcomes": outcomes.run,
    "pools": pool_shards.run,
    "finished_memory": finished_memory.scenario,
}


def finite(value: Any) -> Any:
    """The result with every infinite or NaN number as null: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny version of every scenario (about three minutes on an idle 2-core machine)",
    )
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "latest.json", help="where to write the results (JSON)"
    )
    parser.add_argument(
        "--markdown", type=Path, default=RESULTS / "latest.md", help="where to write the figures as Markdown"
    )
    parser.add_argument(
        "--only", action="append", choices=sorted(SCENARIOS), help="run only these scenarios (repeatable)"
    )
    parser.add_argument(
        "--sqs",
        choices=("fifo", "localstack"),
        default="fifo",
        help="the SQS emulator: fairpost's own, which keeps AWS's FIFO rules (default), or "
        "stock LocalStack, which reopens a group a hand-back returns to (docs/design.md)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = args.only or list(SCENARIOS)
    shown = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m bench", *(shlex.quote(a) for a in shown)])
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    figures: list[Figure] = []
    failures: list[str] = []
    timings: dict[str, float] = {}
    try:
        with contextlib.ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairpost-bench-")))
            print(f"starting redis-server and SQS ({args.sqs}) ...", flush=True)
            redis = stack.enter_context(redis_server())
            if args.sqs == "localstack":
                sqs_url = stack.enter_context(localstack_server()).url
            else:
                # Its own process: the bench's driver does not share its interpreter.
                process, sqs_url = start_fifo_sqs(workdir)
                stack.callback(process.stop)
            backend = Backend(redis_port=redis.port, sqs_url=sqs_url, workdir=workdir)
            for name in names:
                print(f"-- {name} ...", flush=True)
                t0 = time.monotonic()
                try:
                    got: list[Figure] = asyncio.run(SCENARIOS[name](backend, args.quick))
                except Exception:
                    traceback.print_exc()
                    failures.append(name)
                    got = []
                timings[name] = round(time.monotonic() - t0, 1)
                for figure in got:
                    print(f"   {figure.title}: {figure.value_text()} ({figure.verdict}) {figure.detail}")
                figures += got
    except Exception:
        traceback.print_exc()
        print("bench: could not run (see above)", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - started
    host = machine.describe(args.sqs)
    print()
    print(table(figures))
    print(f"\n{machine.summary(host)}\n{command}, {when}, {elapsed:.0f} s")
    result: dict[str, Any] = {
        "command": command,
        "sqs": args.sqs,
        "quick": args.quick,
        "date": when,
        "seconds": round(elapsed, 1),
        "scenario_seconds": timings,
        "machine": host,
        "figures": {f.key: f.to_json() for f in figures},
        "errors": failures,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(finite(result), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(f"results: {args.json}")
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(markdown_table(figures) + "\n", encoding="utf-8")
    failed_safety = [f for f in figures if f.safety and f.met is False]
    for f in failed_safety:
        print(
            f"bench: SAFETY FAILED: {f.title}: {f.value_text()} (target {f.target_text()})", file=sys.stderr
        )
    if failures:
        print(f"bench: scenarios that could not run: {', '.join(failures)}", file=sys.stderr)
        return 2
    return 1 if failed_safety else 0
