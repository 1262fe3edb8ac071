"""Profile one daemon replica while it drains a backlog: ``python -m bench.profile``.

Starts the bench's services, one replica, attaches ``py-spy record`` to it,
enqueues ``--mails`` mails of 20 tenants (quotas not binding), waits until
SES has them all, and writes the samples to ``bench/results/profile.txt``
(collapsed stacks, for flame graph tools) plus a summary of the functions
that hold the most samples, by own time and by time below them.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.cluster import Backend, services, world
from bench.load import Load, wait_sent
from bench.throughput import UNBOUND

RESULTS = Path(__file__).resolve().parent / "results"


def summarise(collapsed: Path, top: int = 25) -> str:
    own: Counter[str] = Counter()
    below: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            below[frame] += n
    out = [f"{total} samples", "", "own time:"]
    out += [f"{100 * n / total:5.1f} %  {f}" for f, n in own.most_common(top)]
    out += ["", "time below (inclusive):"]
    out += [f"{100 * n / total:5.1f} %  {f}" for f, n in below.most_common(top * 2)]
    return "\n".join(out)


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def drain(backend: Backend, mails: int, out: Path) -> None:
    with world(backend, "profile", UNBOUND) as w:
        (replica,) = w.start_replicas(1)
        record = start_py_spy(replica.process.pid, out)
        await asyncio.sleep(1.0)
        async with Load(w.settings) as load:
            for n in range(20):
                await load.burst(f"p{n}", mails // 20)
            await wait_sent(w.ses, mails, within=600)
        record.send_signal(signal.SIGINT)
        record.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--mails", type=int, default=3000)
    parser.add_argument("--output", type=Path, default=RESULTS / "profile.txt")
    args = parser.parse_args()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with services("fairpost-profile-") as backend:
        asyncio.run(drain(backend, args.mails, args.output))
    summary = summarise(args.output)
    args.output.with_suffix(".summary.txt").write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
