"""The Redis work of a fixed workload, counted exactly: ``python -m bench.budget``.

The workload tests/ops/test_redis_budget.py holds to a budget: :data:`MAILS`
mails of :data:`TENANTS` tenants, enqueued through the SDK in bursts a seed
draws, through one replica (every part ``fairpost run`` builds, none of their
background tasks started) driven turn by turn: the dispatcher claims until it
would wait for work (:meth:`Dispatcher.claim_batch`, each batch handed off
before the next is claimed), then the sender receives until it has every
handed-off mail (:meth:`Receiver.turn`). So which jobs each claim and each
receive find does not depend on who is quicker, and the commands are the same
in every run, on a busy machine too.

``python -m bench.budget [--callgrind]`` runs it on the bench's services
(fairpost's SQS, the recording SES server, a redis-server), records its
commands with ``MONITOR`` (bench/shard_replay.py) and prints them by script
and command; ``--callgrind`` also replays them on a fresh redis-server under
valgrind and prints the instructions Redis ran per mail: exact, for comparing
two versions. (The shard figure, bench/shard_replay.py, replays a real drain,
whose shape moves the same count by some 5 % from one run to the next.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import boto3
import redis

from bench.cluster import Backend, services
from bench.load import Load
from bench.redis_profile import script_names
from bench.shard_replay import SKIPPED, Recorder, instructions
from fairpost.config import Settings, load_settings
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.jobs import Job
from fairpost.dispatcher.worker import Outcome, Worker
from fairpost.mailer.daemon.aws import SES_CONFIG, SQS_CONFIG, session
from fairpost.mailer.daemon.parts import Parts, build_parts
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.testing.ses_server import SesServer

SEED = 41
TENANTS = 20
MAILS = 2_000


def budget_settings(redis_url: str) -> Settings:
    return load_settings(
        redis_url=redis_url,
        # Not binding, and a day long: the quota script's own commands, which move
        # old buckets out as time passes, do not follow the run's length.
        global_limits="100000000/day",
        tenant_limits="100000000/day",
        dispatcher={"linger_seconds": 0.001},
        # A visibility far past any run: no send is kept hidden again meanwhile.
        sender={"receivers": 1, "wait_seconds": 1, "linger_seconds": 0, "visibility_timeout": 3600},
    )


class OneAtATime:
    """A worker whose batches go out one after another, in the order the dispatcher
    started them (an asyncio lock wakes its waiters in turn): a claim of 50 is five
    hand-offs of ten, which SQS then holds in one order, whichever would have been
    quicker. Their Redis commands are the same as when they overlap."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._turn = asyncio.Lock()
        self.kind = worker.kind
        self.max_batch = worker.max_batch

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        async with self._turn:
            return await self._worker.handle(jobs)


@asynccontextmanager
async def replica(settings: Settings) -> AsyncIterator[Parts]:
    """Every part ``fairpost run`` builds, none of their background tasks started
    (AWS as the standard variables say)."""
    url, _ = init_queue(boto3.client("sqs"), settings)
    client = async_redis_client(settings)
    aws = session()
    try:
        async with aws.client("sqs", config=SQS_CONFIG) as sqs, aws.client("sesv2", config=SES_CONFIG) as ses:
            parts = await build_parts(settings, client, sqs=sqs, ses_client=ses, queue_url=url)
            if parts.dispatcher is not None:
                workers = parts.dispatcher.workers.items()
                parts.dispatcher.workers = {kind: OneAtATime(worker) for kind, worker in workers}
            yield parts
    finally:
        await client.aclose()


async def drain(parts: Parts, load: Load) -> None:
    """The workload, turn by turn: a few tenants enqueue a burst each, the
    dispatcher claims until it would wait, the sender receives what it handed off."""
    dispatcher, sender = parts.dispatcher, parts.sender
    assert dispatcher is not None and sender is not None
    rng = random.Random(SEED)
    left = {f"t{n:02}": MAILS // TENANTS for n in range(TENANTS)}
    stop = asyncio.Event()
    while sender.stats.received < MAILS:
        waiting = sorted(t for t, n in left.items() if n)
        for tenant in rng.sample(waiting, min(5, len(waiting))):
            count = min(left[tenant], rng.randint(1, 50))
            await load.burst(tenant, count)
            left[tenant] -= count
        # Each batch handed off before the next is claimed: SQS then holds them in
        # one order, whichever hand-off would have been quicker.
        while await dispatcher.claim_batch():
            await dispatcher.settled()
        await dispatcher.settled()
        while sender.stats.received < dispatcher.claimed_total:
            await sender.receiver.turn(stop)


async def capture(settings: Settings, port: int) -> list[list[bytes]]:
    """The commands clients sent during the workload (what a replay needs)."""
    async with replica(settings) as parts:
        recorder = Recorder(port)
        admin = redis.Redis(port=port)
        try:
            recorder.mark(admin, "start")
            async with Load(settings) as load:
                await drain(parts, load)
            recorder.mark(admin, "end")
        finally:
            admin.close()
            commands = recorder.stop()
    return [c for c in commands if c[0].upper().decode(errors="replace") not in SKIPPED]


def tally(commands: list[list[bytes]]) -> collections.Counter[str]:
    """Commands by name, a script call by its file."""
    names = script_names()
    return collections.Counter(
        names.get(c[1].decode(), "a script unknown") if c[0].upper() == b"EVALSHA" else c[0].decode().upper()
        for c in commands
    )


def use_services(backend: Backend, ses: SesServer) -> None:
    """AWS, as the standard variables say, is the bench's SQS and the recording SES server."""
    os.environ.update(
        AWS_ENDPOINT_URL_SQS=backend.sqs_url,
        AWS_ENDPOINT_URL_SESV2=ses.url,
        AWS_DEFAULT_REGION="us-east-1",
    )
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("--callgrind", action="store_true", help="also count Redis's instructions (valgrind)")
    args = parser.parse_args()
    with services("fairpost-budget-") as backend, SesServer() as ses:
        use_services(backend, ses)
        commands = asyncio.run(capture(budget_settings(backend.redis_url()), backend.redis_port))
    per_mail = len(commands) / MAILS
    print(f"{len(commands)} commands for {MAILS} mails of {TENANTS} tenants ({per_mail:.3f} a mail):")
    for name, calls in tally(commands).most_common():
        print(f"  {name:34} {calls:6} {calls / MAILS:8.4f} a mail")
    if args.callgrind:
        print(f"Instructions Redis ran per mail on replay (callgrind): {instructions(commands, MAILS):,.0f}")


if __name__ == "__main__":
    main()
