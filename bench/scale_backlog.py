"""A deep backlog: enqueue and drain rates of a big backlog against a small
one, and Redis memory per waiting job with a 1 KB mail, on Redis's default
configuration (what managed Redis runs).

Both backlogs sit on one redis-server of their own; the last ``chunk`` jobs
of each are enqueued, and ``chunk`` jobs of each drained (claim, hand-off,
finish), in alternating slices so that noise hits both alike. Rates are
jobs per second of the server's CPU time (``INFO cpu``: what one server can
carry, whatever the client), the median slice counting; the client's
wall-clock rates are shown beside them.

The memory figure alone, without the rates (a few minutes for a million jobs)::

    PYTHONPATH=$PWD python -m bench.scale_backlog --jobs 990000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict

import redis.asyncio

from bench.figures import Figure
from bench.scale_redis import Side, mail_payload, new_job, server_cpu, used_memory
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.keys import TOTAL_WAITING
from fairpost.mailer.testing.services import redis_server

TENANTS = 10
SLICE = 500


async def _enqueue(side: Side, count: int, payload: str, fields: dict[str, str]) -> tuple[float, float]:
    """(server CPU µs, wall seconds) to enqueue ``count`` jobs, round robin over the tenants."""
    jobs = [new_job(side.tenants[i % TENANTS], payload=payload, fields=fields) for i in range(count)]
    before, t0 = await server_cpu(side.client), time.perf_counter()
    for start in range(0, count, 500):
        await side.store.enqueue(jobs[start : start + 500])
    return (await server_cpu(side.client) - before) * 1e6, time.perf_counter() - t0


async def _drain(side: Side, count: int) -> tuple[float, float, int]:
    """(server CPU µs, wall seconds, jobs) to claim, hand off and finish ``count`` jobs."""
    before, t0 = await server_cpu(side.client), time.perf_counter()
    done = 0
    while done < count:
        jobs = await side.store.claim(min(100, count - done))
        if not jobs:
            break
        ids = [job.id for job in jobs]
        await side.store.handed_off(ids)
        async with side.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                await side.store.finish(job_id, JobState.SENT, keep_seconds=600, pipeline=pipe)
            await pipe.execute()
        done += len(ids)
    return (await server_cpu(side.client) - before) * 1e6, time.perf_counter() - t0, done


async def measure(big: int, small: int, chunk: int) -> list[Figure]:
    payload, fields = mail_payload(1024)
    with redis_server() as server:
        client = redis.asyncio.Redis.from_url(server.url())
        try:
            many, few = Side(client, "deep", TENANTS), Side(client, "shallow", TENANTS)
            empty = await used_memory(client)
            await _enqueue(many, big - chunk, payload, fields)
            per_job = (await used_memory(client) - empty) / (big - chunk)
            rates: dict[str, dict[str, list[float]]] = {
                s.name: {"enqueue": [], "enqueue_wall": [], "drain": [], "drain_wall": []}
                for s in (many, few)
            }
            # The last ``chunk`` jobs of each backlog, in alternating slices.
            for i in range(0, chunk, SLICE):
                n = min(SLICE, chunk - i)
                for side in (many, few) if i % (2 * SLICE) == 0 else (few, many):
                    us, s = await _enqueue(side, n, payload, fields)
                    rates[side.name]["enqueue"].append(n / us * 1e6)
                    rates[side.name]["enqueue_wall"].append(n / s)
            depth = {s.name: int(await client.hget(s.keys.counts(), TOTAL_WAITING) or 0) for s in (many, few)}
            for i in range(0, chunk, SLICE):
                for side in (many, few) if i % (2 * SLICE) == 0 else (few, many):
                    us, s, n = await _drain(side, min(SLICE, chunk - i))
                    rates[side.name]["drain"].append(n / us * 1e6)
                    rates[side.name]["drain_wall"].append(n / s)
        finally:
            await client.aclose()
    deep, shallow = rates["deep"], rates["shallow"]
    figures = []
    for what in ("enqueue", "drain"):
        d_rate, s_rate = statistics.median(deep[what]), statistics.median(shallow[what])
        d_wall, s_wall = statistics.median(deep[f"{what}_wall"]), statistics.median(shallow[f"{what}_wall"])
        figures.append(
            Figure(
                key=f"scale_{what}_rate_ratio",
                title=f"Scale: {what} rate, {depth['deep']:,}-job backlog / {depth['shallow']:,}-job",
                value=d_rate / s_rate,
                unit="x",
                op=">=",
                target=0.9,
                detail=(
                    f"{d_rate:,.0f} / {s_rate:,.0f} jobs per second of Redis CPU (INFO cpu); client wall "
                    f"clock {d_wall:,.0f} / {s_wall:,.0f} jobs/s; {chunk:,} jobs each, {TENANTS} tenants, "
                    f"median of {len(deep[what])} alternating slices of {SLICE}"
                ),
                data={"deep": deep, "shallow": shallow, "depth": depth},
            )
        )
    figures.append(memory_figure(per_job, big - chunk, len(payload)))
    return figures


def memory_figure(per_job: float, jobs: int, payload_bytes: int) -> Figure:
    return Figure(
        key="scale_memory_per_job",
        title="Scale: Redis memory per waiting job, 1 KB mail (Redis's default config)",
        value=per_job / 1024,
        unit=" KB",
        op="<=",
        target=1.5,
        detail=(
            f"{per_job:,.0f} bytes per job over {jobs:,} waiting jobs, Redis's default configuration "
            f"(hash-max-listpack-value 64, list-max-listpack-size -2); INFO memory used_memory, payload "
            f"{payload_bytes} bytes as the SDK writes it, in its queue entry, {TENANTS} tenants"
        ),
        data={"bytes_per_job": per_job, "jobs": jobs, "payload_bytes": payload_bytes},
    )


async def memory_per_job(jobs: int) -> Figure:
    """The memory figure alone: ``jobs`` waiting 1 KB mails on a fresh redis-server."""
    payload, fields = mail_payload(1024)
    with redis_server() as server:
        client = redis.asyncio.Redis.from_url(server.url())
        try:
            side = Side(client, "memory", TENANTS)
            empty = await used_memory(client)
            for start in range(0, jobs, 50_000):
                await _enqueue(side, min(50_000, jobs - start), payload, fields)
            per_job = (await used_memory(client) - empty) / jobs
        finally:
            await client.aclose()
    return memory_figure(per_job, jobs, len(payload))


def main() -> None:
    """Run as a module: the memory figure alone."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=990_000, help="waiting jobs to measure over")
    args = parser.parse_args()
    figure = asyncio.run(memory_per_job(args.jobs))
    print(json.dumps(asdict(figure)))


if __name__ == "__main__":
    main()
