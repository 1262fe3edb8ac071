"""The three ways to throttle a tenant (docs/design.md, "The three ways to throttle"), on one workload.

One dispatcher with a few concurrency slots serves a throttled tenant's
backlog, light tenants' mail and jobs of another kind (``task``: 20 ms of
I/O each) for a fixed time, three ways:

- ``sleep``: the mail worker waits in the worker until the quota frees
  (:class:`SleepInWorker`), holding its slot;
- ``put-back``: the mail worker hands a refused job straight back to its
  queue (:class:`PutBack` with :class:`PutBackDispatcher`), to be dequeued
  again;
- ``fairpost``: the mail worker hands mail to the SQS FIFO queue and the
  sender extends the visibility of what the quota refuses (the product).

Reported for each: the other jobs' latency (``task`` jobs, enqueue to
start: the figure; light tenants' mail, enqueue to SES: beside it, where
fairpost's includes the SQS hop the naive ways do not make), the slots held (mean and peak, all and by
the throttled tenant), the wasted work (dequeues or receives that ended
in a refusal), what the throttled tenant got sent and the CPU the
process spent. The first two
strategies live here only: they are the naive ways fairpost is measured
against, not options of the product.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from bench.cluster import REGION, Backend
from bench.figures import Figure, percentile
from bench.load import mail
from fairpost.config import Settings
from fairpost.config.sections import DispatcherSettings, TenantSettings
from fairpost.dispatcher.jobs import Job
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, NewJob, store_limits
from fairpost.dispatcher.worker import Done, Outcome, Requeue, Worker
from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.aws import SES_CONFIG, SQS_CONFIG, session
from fairpost.mailer.daemon.handoff import MailWorker
from fairpost.mailer.daemon.parts import build_parts
from fairpost.mailer.daemon.sender import Sender
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.client import AsyncMailClient
from fairpost.mailer.sdk.envelope import Envelope, decode, encode
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer

THROTTLED = "throttled"
TASK_KIND = "task"
TASK_SECONDS = 0.02
SLOTS = 8
QUOTA = 5
LIGHT = {f"light{i}": 2.0 for i in range(3)}
TASK_RATE = 10.0


@dataclass
class Tally:
    """What the strategies count while they run."""

    task_started: dict[str, float] = field(default_factory=dict)
    throttled_in_worker: int = 0
    sleeps: int = 0
    put_back: int = 0
    throttled_received: int = 0


class TaskWorker:
    """Another kind of job sharing the dispatcher: 20 ms of I/O."""

    kind = TASK_KIND
    max_batch = 10

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        now = time.monotonic()
        for job in jobs:
            self.tally.task_started[job.id] = now
        await asyncio.sleep(TASK_SECONDS)
        return [Done() for _ in jobs]


class _DirectMail:
    """Shared by the two naive strategies: quota, then SES straight from the worker."""

    kind = "mail"
    max_batch = 1

    def __init__(self, quota: QuotaEngine, settings: Settings, ses_client: Any, tally: Tally) -> None:
        self.quota = quota
        self.settings = settings
        self.ses = ses_client
        self.tally = tally

    def envelope(self, job: Job) -> Envelope:
        return decode(encode(job.id, job.tenant, job.created_ms, job.payload))

    async def acquire(self, env: Envelope) -> float:
        """0.0 if granted, else the seconds until it would fit."""
        grant = await self.quota.acquire(
            env.tenant,
            [env.mail.recipients],
            self.settings.global_limits,  # type: ignore[arg-type]
            self.settings.limits_for(env.tenant),
        )
        return 0.0 if grant.granted else max(grant.retry_after, 0.001)

    async def send(self, env: Envelope) -> None:
        await ses.send(self.ses, env, TenantSettings())


class SleepInWorker(_DirectMail):
    """Strategy 1: over quota, sleep in the worker (holding the slot) until it frees."""

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        for job in jobs:
            env = self.envelope(job)
            throttled = job.tenant == THROTTLED
            self.tally.throttled_in_worker += throttled
            try:
                while (wait := await self.acquire(env)) > 0:
                    self.tally.sleeps += 1
                    await asyncio.sleep(wait)
                await self.send(env)
            finally:
                self.tally.throttled_in_worker -= throttled
        return [Done() for _ in jobs]


class PutBack(_DirectMail):
    """Strategy 2: over quota, give the job back to its queue (see PutBackDispatcher)."""

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        outcomes: list[Outcome] = []
        for job in jobs:
            env = self.envelope(job)
            throttled = job.tenant == THROTTLED
            self.tally.throttled_in_worker += throttled
            try:
                if await self.acquire(env) > 0:
                    outcomes.append(Requeue("over quota"))
                    continue
                await self.send(env)
                outcomes.append(Done())
            finally:
                self.tally.throttled_in_worker -= throttled
        return outcomes


class PutBackDispatcher(Dispatcher):
    """A dispatcher that puts a refused job back on its queue at once.

    fairpost's own dispatcher waits (with backoff) before a ``Requeue`` goes
    back, holding the slot, because a worker that refuses is usually a
    downstream that is down; the naive put-back strategy does not wait.
    """

    def __init__(self, *args: Any, tally: Tally, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tally = tally

    async def _settle(self, jobs: list[Job], outcomes: Sequence[Outcome]) -> None:
        back = [j.id for j, o in zip(jobs, outcomes, strict=True) if isinstance(o, Requeue)]
        if back:
            await self.store.requeue(back)
            self.tally.put_back += len(back)
            for job_id in back:
                self._held.pop(job_id, None)
        rest = [(j, o) for j, o in zip(jobs, outcomes, strict=True) if not isinstance(o, Requeue)]
        await super()._settle([j for j, _ in rest], [o for _, o in rest])


class ReceiveCounter:
    """The sender's SQS client, counting receptions of the throttled tenant's messages."""

    def __init__(self, inner: Any, tally: Tally) -> None:
        self._inner = inner
        self._tally = tally

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive_message(self, **kwargs: Any) -> Any:
        response = await self._inner.receive_message(**kwargs)
        for message in response.get("Messages", []):
            if message.get("Attributes", {}).get("MessageGroupId") == THROTTLED:
                self._tally.throttled_received += 1
        return response


class CountingMailWorker:
    """fairpost's mail worker, counting the throttled tenant's jobs inside it."""

    kind = "mail"

    def __init__(self, inner: MailWorker, tally: Tally) -> None:
        self.inner = inner
        self.tally = tally
        self.max_batch = inner.max_batch

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        throttled = sum(1 for j in jobs if j.tenant == THROTTLED)
        self.tally.throttled_in_worker += throttled
        try:
            return await self.inner.handle(jobs)
        finally:
            self.tally.throttled_in_worker -= throttled


@dataclass
class Result:
    name: str
    light_latencies: list[float]
    task_latencies: list[float]
    slots_mean: float
    slots_peak: int
    throttled_slots_mean: float
    throttled_slots_peak: int
    wasted: int
    wasted_what: str
    throttled_sent: int
    seconds: float
    cpu_seconds: float
    never: int
    """Other jobs still waiting at the end (their latency is counted until then)."""

    def line(self) -> str:
        return (
            f"{self.name}: light mail p99 {_ms(percentile(self.light_latencies, 99))}, "
            f"task p99 {_ms(percentile(self.task_latencies, 99))}; slots held mean {self.slots_mean:.1f} "
            f"(throttled tenant {self.throttled_slots_mean:.1f}), peak {self.slots_peak}/{SLOTS}; "
            f"{self.wasted} wasted {self.wasted_what}; throttled tenant sent {self.throttled_sent} "
            f"in {self.seconds:.0f} s (quota {QUOTA}/second); {self.cpu_seconds:.1f} s CPU"
            + (f"; {self.never} other jobs never ran (latency counted to the end)" if self.never else "")
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _settings(backend: Backend, prefix: str) -> Settings:
    return Settings(
        redis_url=backend.redis_url(),
        key_prefix=prefix,
        queue_name=f"{prefix}.fifo",
        global_limits="1000/second",
        tenant_limits="100/second",
        tenants={THROTTLED: TenantSettings(limits=f"{QUOTA}/second")},
        # No linger, as the naive strategies' dispatchers have none: the three differ
        # only in how they throttle.
        dispatcher=DispatcherSettings(concurrency=SLOTS, linger_seconds=0),
    )


@contextlib.asynccontextmanager
async def _aws(backend: Backend, ses_url: str) -> AsyncIterator[tuple[Any, Any]]:
    creds = {"region_name": REGION, "aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
    aws = session()
    async with (
        aws.client("sqs", endpoint_url=backend.sqs_url, config=SQS_CONFIG, **creds) as sqs,
        aws.client("sesv2", endpoint_url=ses_url, config=SES_CONFIG, **creds) as ses_client,
    ):
        yield sqs, ses_client


async def one(backend: Backend, name: str, seconds: float, burst: int) -> Result:
    prefix = f"bench-strategy-{name}-{uuid.uuid4().hex[:6]}"
    settings = _settings(backend, prefix)
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    keys = MailKeys(prefix)
    store = JobStore(client, keys, store_limits(settings))
    quota = QuotaEngine(client, keys)
    tally = Tally()
    queue_url = ""
    if name == "fairpost":
        queue_url, _ = init_queue(backend.sqs(), settings)
    with SesServer() as ses_server:
        async with _aws(backend, ses_server.url) as (sqs, ses_client):
            workers: list[Worker] = [TaskWorker(tally)]
            sender: Sender | None = None
            if name == "sleep":
                workers.append(SleepInWorker(quota, settings, ses_client, tally))
                dispatcher = Dispatcher(store, workers, concurrency=SLOTS)
            elif name == "put-back":
                workers.append(PutBack(quota, settings, ses_client, tally))
                dispatcher = PutBackDispatcher(store, workers, concurrency=SLOTS, tally=tally)
            else:
                # The product as fairpost run builds it: the dispatcher (its concurrency
                # and linger in the settings) and the sender, on the settings' limits.
                parts = await build_parts(
                    settings, client, sqs=sqs, ses_client=ses_client, queue_url=queue_url, full=False,
                    sender_sqs=ReceiveCounter(sqs, tally),
                    workers=lambda mail: [*workers, CountingMailWorker(mail, tally)],
                )  # fmt: skip
                assert parts.dispatcher is not None and parts.sender is not None
                dispatcher, sender = parts.dispatcher, parts.sender
            stop = asyncio.Event()
            tasks = [asyncio.create_task(dispatcher.run(stop))]
            if sender is not None:
                tasks.append(asyncio.create_task(sender.run(stop)))
            samples: list[tuple[int, int]] = []

            async def sample() -> None:
                while not stop.is_set():
                    samples.append((dispatcher.busy, tally.throttled_in_worker))
                    await asyncio.sleep(0.02)

            tasks.append(asyncio.create_task(sample()))
            cpu0 = _cpu()
            enqueued_mail: dict[str, tuple[str, float]] = {}
            enqueued_task: dict[str, float] = {}
            async with AsyncMailClient(settings, redis_client=client) as sdk:
                for job_id in await sdk.send_many(THROTTLED, [mail(i) for i in range(burst)]):
                    enqueued_mail[job_id] = (THROTTLED, time.time())
                rng = random.Random(11)
                arrivals = []
                for tenant, rate in [*LIGHT.items(), (TASK_KIND, TASK_RATE)]:
                    t = rng.expovariate(rate)
                    while t < seconds:
                        arrivals.append((t, tenant))
                        t += rng.expovariate(rate)
                arrivals.sort()
                start = time.monotonic()
                for n, (offset, tenant) in enumerate(arrivals):
                    delay = start + offset - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if tenant == TASK_KIND:
                        job_id = uuid.uuid4().hex
                        await store.enqueue([NewJob(job_id, "svc", TASK_KIND, "{}")])
                        enqueued_task[job_id] = time.monotonic()
                    else:
                        job_id = (await sdk.send_many(tenant, [mail(burst + n)]))[0]
                        enqueued_mail[job_id] = (tenant, time.time())
                await asyncio.sleep(min(1.0, seconds / 3))
            cpu = _cpu() - cpu0
            ended_wall, ended_mono = time.time(), time.monotonic()
            stop.set()
            # As the daemon does after its grace period: a long poll in flight is cancelled.
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await dispatcher.drain(1.0)
            if sender is not None:
                await sender.release_held()
            sent = ses_server.sent
    await client.flushdb()
    await client.aclose()
    if queue_url:
        with contextlib.suppress(Exception):
            backend.sqs().delete_queue(QueueUrl=queue_url)

    arrived = {m.job_id: m.wall_time for m in sent if m.job_id}
    # A job still waiting at the end counts as waiting until then: a lower bound.
    light = [
        arrived.get(j, ended_wall) - at for j, (tenant, at) in enqueued_mail.items() if tenant != THROTTLED
    ]
    tasks_lat = [tally.task_started.get(j, ended_mono) - at for j, at in enqueued_task.items()]
    waiting = sum(1 for j in enqueued_task if j not in tally.task_started)
    waiting += sum(1 for j, (t, _) in enqueued_mail.items() if t != THROTTLED and j not in arrived)
    if name == "fairpost":
        assert sender is not None
        throttled_sent = sum(1 for m in sent if m.tag("fairpost-tenant") == THROTTLED)
        wasted = tally.throttled_received - throttled_sent
        what = (
            f"receives (its messages received {tally.throttled_received} times; "
            f"{sender.stats.throttled_by_quota} refusals, most retried in the sender, not SQS)"
        )
    elif name == "put-back":
        wasted, what = tally.put_back, "dequeues (put back)"
    else:
        wasted, what = tally.sleeps, "sleeps holding a slot (no dequeue wasted)"
    return Result(
        name=name,
        light_latencies=light,
        task_latencies=tasks_lat,
        slots_mean=sum(s[0] for s in samples) / max(1, len(samples)),
        slots_peak=max((s[0] for s in samples), default=0),
        throttled_slots_mean=sum(s[1] for s in samples) / max(1, len(samples)),
        throttled_slots_peak=max((s[1] for s in samples), default=0),
        wasted=wasted,
        wasted_what=what,
        throttled_sent=sum(1 for m in sent if m.tag("fairpost-tenant") == THROTTLED),
        seconds=seconds,
        cpu_seconds=cpu,
        never=waiting,
    )


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(backend: Backend, quick: bool) -> list[Figure]:
    seconds, burst = (1.5, 12) if quick else (20.0, 150)
    figures = []
    for name in ("sleep", "put-back", "fairpost"):
        r = await one(backend, name, seconds, burst)
        figures.append(
            Figure(
                key=f"strategy_{name.replace('-', '_')}",
                title=f"Strategy {name}: p99 latency of another job kind",
                value=percentile(r.task_latencies, 99) * 1000,
                unit=" ms",
                detail=r.line(),
                data={
                    "light_p50_ms": percentile(r.light_latencies, 50) * 1000,
                    "light_p99_ms": percentile(r.light_latencies, 99) * 1000,
                    "task_p50_ms": percentile(r.task_latencies, 50) * 1000,
                    "task_p99_ms": percentile(r.task_latencies, 99) * 1000,
                    "slots_mean": r.slots_mean,
                    "slots_peak": r.slots_peak,
                    "throttled_slots_mean": r.throttled_slots_mean,
                    "throttled_slots_peak": r.throttled_slots_peak,
                    "wasted": r.wasted,
                    "wasted_what": r.wasted_what,
                    "throttled_sent": r.throttled_sent,
                    "cpu_seconds": r.cpu_seconds,
                    "never_ran": r.never,
                    "slots": SLOTS,
                    "seconds": seconds,
                    "burst": burst,
                    "quota_per_second": QUOTA,
                },
            )
        )
    return figures
