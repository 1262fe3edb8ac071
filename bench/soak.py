"""Redis's growth at a steady load, against the memory model: ``python -m bench.soak``.

    python -m bench.soak --minutes 12 --rate 36

From outside, as an operator would run it: its own redis-server (no
``maxmemory``), fairpost's SQS (its own process), the recording SES server, and
one ``fairpost run`` daemon (bench/replica.py, a subprocess configured by
``FAIRPOST_*`` variables alone; SES events on, every retention its default,
quotas far above the load, so nothing waits for one). The SDK enqueues at a
steady rate (Poisson arrivals, one call a mail) over ``--tenants`` tenants:
first ``--warmup-seconds`` of it, drained (the scripts loaded, every tenant's
counters made), then the soak itself, drained. ``INFO memory``'s
``used_memory`` and ``DBSIZE`` are sampled every ``--sample-seconds``.

Within the soak no retention ends, so the memory model of docs/operations.md
("Redis memory per sent mail": its first day) predicts

    growth = mails sent * S1 + waiting mails * W + constants

with S1 the bytes a sent mail keeps for its first day: its record, its line in a
history bucket, its ``mail.sent`` feed event and its SES message id's index (and
an idempotency key, which this load does not use), each with what Redis's tables
keep for its key beyond its ``MEMORY USAGE``. Each term is measured in the same
run: ``MEMORY USAGE`` of every key of its kind, after the soak less before, over
the mails sent; the constants (per tenant and day, grants and claims of the
last minutes) the same way; the tables' growth from the keys, and the keys
with a TTL, at both ends (bench/key_tables.py: exact, doublings included).
Both ends are drained, so waiting is 0. The verdict: ``used_memory``'s growth
over the prediction, at most 1 + :data:`ROUNDING` (the allocator's size classes,
which ``MEMORY USAGE`` leaves out of a listpack). Beside it: ``MEMORY STATS``'
two tables of keys, and the second half's median interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio

from bench import key_tables
from bench.cluster import BenchError, World, services, world
from bench.finished_memory import SHORT_LIVED_SECONDS, kind_of
from bench.load import Load
from fairpost.mailer.errors import TimedOut
from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.testing.wait import wait_for_async

ROUNDING = 0.05
"""What the allocator adds to the keys' ``MEMORY USAGE`` and their tables, at most:
a listpack (a record, a bucket) is counted at its length and allocated in
jemalloc's size classes, 16 bytes apart up to 128, a quarter apart above."""

MODEL_BYTES = {"job": 424, "hist": 90, "outcomes": 225, "sesmsg": 184, "idem": 114}
"""The model's bytes a sent mail keeps in its first day, by kind of key
(docs/operations.md): its record, its history line, its feed event, its SES
message id's index, its idempotency key (only a mail with one)."""

TERMS = {
    "job": "its record",
    "hist": "its line in a history bucket",
    "outcomes": "its mail.sent event in the outcome feed",
    "sesmsg": "its SES message id's index",
    "idem": "its idempotency key",
}
SHORT_LIVED = " (1 h or less)"
"""Added to the kind of a key of a TTL of at most an hour (grants, claims): gone
minutes after its mail, a constant at a steady load."""


@dataclass
class Sample:
    seconds: float
    used_memory: int
    keys: int
    enqueued: int
    sent: int
    key_table: int = 0
    """``MEMORY STATS``' ``overhead.hashtable.main``: the key space's table, its
    slots (8 bytes each, a power of two of them) and an entry and object a key."""
    expiry_table: int = 0
    """``overhead.hashtable.expires``: the table of the keys' TTLs, its slots and an
    entry a key with a TTL; none of it in a key's ``MEMORY USAGE``."""
    expires: int = 0
    """Keys with a TTL (``INFO keyspace``)."""


@dataclass
class Weighed:
    """``MEMORY USAGE`` and key counts of every key on the server, by kind."""

    bytes: dict[str, int] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)

    def minus(self, before: Weighed) -> Weighed:
        kinds = set(self.bytes) | set(before.bytes)
        return Weighed(
            {k: self.bytes.get(k, 0) - before.bytes.get(k, 0) for k in kinds},
            {k: self.keys.get(k, 0) - before.keys.get(k, 0) for k in kinds},
        )


async def weigh(client: redis.asyncio.Redis) -> Weighed:
    """Every key's ``MEMORY USAGE`` (all of its elements) by kind, keys of an hour's
    TTL or less apart (:data:`SHORT_LIVED`; the server is the soak's alone)."""
    out = Weighed()
    batch: list[bytes] = []

    async def flush() -> None:
        async with client.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.ttl(key)
                pipe.memory_usage(key, samples=0)
            answers = await pipe.execute()
        for key, ttl, size in zip(batch, answers[::2], answers[1::2], strict=True):
            short = 0 <= int(ttl) <= SHORT_LIVED_SECONDS
            kind = kind_of(key.decode()) + (SHORT_LIVED if short else "")
            out.bytes[kind] = out.bytes.get(kind, 0) + int(size or 0)
            out.keys[kind] = out.keys.get(kind, 0) + 1
        batch.clear()

    async for key in client.scan_iter(count=1000):
        batch.append(key)
        if len(batch) >= 500:
            await flush()
    if batch:
        await flush()
    return out


async def history_lines(client: redis.asyncio.Redis, w: World) -> int:
    """Lines in the history's buckets: one a mail finished as sent."""
    total = 0
    async for bucket in client.scan_iter(match=w.keys.history_prefix() + "*", count=1000):
        total += int(await client.hlen(bucket))
    return total


async def drained(client: redis.asyncio.Redis, w: World, load: Load, within: float) -> None:
    """Wait until every mail enqueued is at SES and finished (its history line written)."""
    wanted = len(load.jobs)

    async def done() -> bool:
        if not all(r.alive() for r in w.replicas):
            raise BenchError(f"the daemon died:\n{w.replicas[0].log_tail()}")
        return w.ses.sent_count >= wanted and await history_lines(client, w) >= wanted

    try:
        await wait_for_async(done, within=within, what=f"{wanted} mails sent and finished", interval=0.5)
    except TimedOut:
        raise BenchError(
            f"{wanted} mails enqueued, {w.ses.sent_count} at SES, "
            f"{await history_lines(client, w)} finished after {within:.0f} s"
        ) from None


async def sample(client: redis.asyncio.Redis, w: World, load: Load, start: float) -> Sample:
    used = int((await client.info("memory"))["used_memory"])
    keys = int(await client.dbsize())
    expires = int((await client.info("keyspace")).get("db0", {}).get("expires", 0))
    tables = (await client.memory_stats()).get("db.0", {})
    return Sample(
        round(time.monotonic() - start, 1),
        used,
        keys,
        len(load.jobs),
        w.ses.sent_count,
        int(tables.get("overhead.hashtable.main", 0)),
        int(tables.get("overhead.hashtable.expires", 0)),
        expires,
    )


async def sampler(client: redis.asyncio.Redis, w: World, load: Load, every: float, out: list[Sample]) -> None:
    """A :class:`Sample` every ``every`` seconds, printed, until cancelled."""
    start = time.monotonic()
    while True:
        await asyncio.sleep(every)
        s = await sample(client, w, load, start)
        out.append(s)
        print(
            f"  {s.seconds:7.1f} s: used_memory {s.used_memory:,} B, {s.keys:,} keys, "
            f"{s.enqueued:,} enqueued, {s.sent:,} sent",
            flush=True,
        )


@dataclass(frozen=True)
class Plan:
    minutes: float
    rate: float
    tenants: int
    sample_seconds: float
    warmup_seconds: float

    def rates(self) -> dict[str, float]:
        return {f"t{n:02}": self.rate / self.tenants for n in range(self.tenants)}

    def drain_within(self) -> float:
        return 60.0 + self.minutes * 15


async def soak(w: World, p: Plan) -> dict[str, Any]:
    """The warm-up, drained; the soak, sampled and drained; what the keys hold before and after."""
    client = redis.asyncio.Redis.from_url(w.config["redis_url"])
    samples: list[Sample] = []
    try:
        async with Load(w.settings) as load:
            await load.steady(p.rates(), p.warmup_seconds, seed=1)
            await drained(client, w, load, p.drain_within())
            begin = await sample(client, w, load, time.monotonic())
            before = await weigh(client)
            task = asyncio.create_task(sampler(client, w, load, p.sample_seconds, samples))
            try:
                await load.steady(p.rates(), p.minutes * 60, seed=41)
                await drained(client, w, load, p.drain_within())
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            end = await sample(client, w, load, time.monotonic())
            after = await weigh(client)
    finally:
        await client.aclose()
    return {"begin": begin, "end": end, "samples": samples, "kinds": after.minus(before)}


def verdict(begin: Sample, end: Sample, kinds: Weighed) -> dict[str, Any]:
    """The figures: growth a mail, the model's prediction (its terms measured), their ratio."""
    sent = end.sent - begin.sent
    if sent <= 0:
        raise BenchError("no mail was sent during the soak")
    growth = end.used_memory - begin.used_memory
    first_day = {k: round(kinds.bytes.get(k, 0) / sent, 1) for k in TERMS}
    constants = {k: b for k, b in sorted(kinds.bytes.items()) if k not in TERMS and b}
    per_mail = sum(first_day.values())
    tables = key_tables.growth((begin.keys, end.keys), (begin.expires, end.expires))
    prediction = per_mail * sent + sum(constants.values()) + tables
    ratio = growth / prediction
    documented: float = sum(MODEL_BYTES[k] for k in TERMS if k != "idem")
    # Each of the mail's keys kept its first day (its record, its index) with its
    # tables' share on average (bench/key_tables.py).
    documented += 2 * key_tables.per_key(with_ttl=True)
    return {
        "mails_sent": sent,
        "used_memory_growth": growth,
        "bytes_per_sent_mail": round(growth / sent, 1),
        "keys_per_sent_mail": round((end.keys - begin.keys) / sent, 3),
        "waiting_at_start_and_end": [begin.enqueued - begin.sent, end.enqueued - end.sent],
        "first_day_bytes_per_mail_by_term": first_day,
        "model_first_day_bytes_per_mail": round(per_mail, 1),
        "model_documented_first_day_bytes_per_mail": documented,
        "constants_bytes": constants,
        "constants_bytes_per_sent_mail": round(sum(constants.values()) / sent, 1),
        "key_tables_bytes_per_sent_mail": round(tables / sent, 1),
        "prediction_per_sent_mail": round(prediction / sent, 1),
        "growth_over_prediction": round(ratio, 3),
        "beyond_memory_usage_per_sent_mail": round((growth - sum(kinds.bytes.values())) / sent, 1),
        "key_table_growth_per_sent_mail": round((end.key_table - begin.key_table) / sent, 1),
        "expiry_table_growth_per_sent_mail": round((end.expiry_table - begin.expiry_table) / sent, 1),
        "growth_over_documented": round(growth / (documented * sent + sum(constants.values())), 3),
        "allowed_ratio": 1 + ROUNDING,
        "verdict": "meets" if ratio <= 1 + ROUNDING else "misses",
    }


def second_half(samples: list[Sample], per_mail: float) -> dict[str, Any]:
    """The median growth a mail of the sampling intervals of the soak's second half,
    over the first-day terms a mail: the margin at a steady load, once the grants and
    claims of the first minutes expire as fast as new ones come, between two doublings
    of Redis's tables of keys and of expiries (8 bytes a slot each, at each power of
    two keys), which a median leaves out and the whole run's growth holds."""
    half = (samples[-1].seconds / 2) if samples else 0.0
    rates = [
        (b.used_memory - a.used_memory) / (b.sent - a.sent)
        for a, b in itertools.pairwise(samples)
        if a.seconds >= half and b.sent > a.sent
    ]
    median = statistics.median(rates) if rates else None
    return {
        "second_half_intervals": len(rates),
        "second_half_median_bytes_per_sent_mail": None if median is None else round(median, 1),
        "second_half_median_over_first_day_terms": (
            None if median is None or not per_mail else round(median / per_mail, 3)
        ),
    }


def config() -> dict[str, Any]:
    """The daemon's settings over bench/cluster.py's: SES events on (a sent mail's SES
    message id is kept, as in production); quotas far above the load."""
    return {
        "events_queue_name": "fairpost-soak-events",
        "global_limits": "100000000/day",
        "tenant_limits": "100000000/day",
    }


@contextlib.contextmanager
def started() -> Iterator[World]:
    """The services, the queues and one daemon, stopped and removed on exit."""
    with services("fairpost-soak-") as backend, world(backend, "soak", config()) as w:
        init_events_queue(backend.sqs(), w.settings)
        w.start_replicas(1, timeout=60.0)
        yield w


def run(p: Plan) -> dict[str, Any]:
    with started() as w:
        got = asyncio.run(soak(w, p))
        errors = w.replica_errors()
    result = verdict(got["begin"], got["end"], got["kinds"])
    per_mail = result["model_first_day_bytes_per_mail"]
    result.update(second_half(got["samples"], per_mail))
    result["begin"], result["end"] = asdict(got["begin"]), asdict(got["end"])
    result["keys_by_kind"] = got["kinds"].keys
    result["samples"] = [asdict(s) for s in got["samples"]]
    result["daemon_errors"] = len(errors)
    result["plan"] = asdict(p)
    return result


def report(result: dict[str, Any]) -> str:
    terms = ", ".join(f"{k} {b}" for k, b in result["first_day_bytes_per_mail_by_term"].items())
    return "\n".join(
        [
            f"mails sent: {result['mails_sent']:,}",
            f"used_memory growth: {result['used_memory_growth']:,} B",
            f"bytes per sent mail: {result['bytes_per_sent_mail']}",
            f"keys per sent mail: {result['keys_per_sent_mail']}",
            f"waiting at start and end: {result['waiting_at_start_and_end']}",
            "model, first day, a mail (MEMORY USAGE in this run): "
            f"{result['model_first_day_bytes_per_mail']} "
            f"({terms}; documented: {result['model_documented_first_day_bytes_per_mail']})",
            f"model, constants: {result['constants_bytes_per_sent_mail']} B a mail "
            f"({', '.join(f'{k} {b}' for k, b in result['constants_bytes'].items())} B)",
            f"model, the tables of keys: {result['key_tables_bytes_per_sent_mail']} B a mail",
            f"prediction per sent mail: {result['prediction_per_sent_mail']}",
            f"second half, the median of {result['second_half_intervals']} intervals, a mail: "
            f"{result['second_half_median_bytes_per_sent_mail']} B, "
            f"{result['second_half_median_over_first_day_terms']} x the first-day terms",
            f"beyond the keys' MEMORY USAGE, a mail: {result['beyond_memory_usage_per_sent_mail']} B "
            f"(MEMORY STATS: the key table grew {result['key_table_growth_per_sent_mail']} B a mail, "
            f"the expiry table {result['expiry_table_growth_per_sent_mail']})",
            f"growth / prediction: {result['growth_over_prediction']} "
            f"(with the documented terms: {result['growth_over_documented']}); "
            f"allowed {result['allowed_ratio']:.2f}: {result['verdict']}",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=12.0, help="the soak's length (default 12)")
    parser.add_argument("--rate", type=float, default=36.0, help="mails a second, all tenants (default 36)")
    parser.add_argument(
        "--tenants", type=int, default=20, help="tenants the load is spread over (default 20)"
    )
    parser.add_argument("--sample-seconds", type=float, default=30.0, help="between samples (default 30)")
    parser.add_argument(
        "--warmup-seconds", type=float, default=30.0, help="load before the soak (default 30)"
    )
    parser.add_argument("--json", type=Path, help="also write the result here (JSON)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("minutes", "rate", "tenants", "sample_seconds"):
        if getattr(args, name) <= 0:
            print(f"bench.soak: --{name.replace('_', '-')} must be more than 0", file=sys.stderr)
            return 2
    p = Plan(args.minutes, args.rate, args.tenants, args.sample_seconds, max(0.0, args.warmup_seconds))
    shown = sys.argv[1:] if argv is None else argv
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"soak: {p.minutes} min at {p.rate}/s over {p.tenants} tenants, {when}", flush=True)
    try:
        result = run(p)
    except BenchError as e:
        print(f"bench.soak: could not run: {e}", file=sys.stderr)
        return 2
    result["command"] = " ".join(["python -m bench.soak", *(shlex.quote(a) for a in shown)])
    result["date"] = when
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    # A verdict, not an exit status (as python -m bench): a tiny run misses by
    # Redis's tables doubling, which a long one spreads over its mails.
    return 0


if __name__ == "__main__":
    sys.exit(main())
