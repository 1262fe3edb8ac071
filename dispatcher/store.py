"""Per-tenant job queues in Redis: enqueue, fair claim, hand-off, finish.

Every state change is one Lua script (the ``.lua`` files beside this
module), so a replica that dies between two calls leaves nothing half-done:
what it claimed comes back when its lease expires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from config import Settings
from dispatcher.durable import Durability
from dispatcher.jobs import Job, JobState
from dispatcher.keys import Keys
from dispatcher.scripts import lua_source

# Sync and async clients take the same script calls; the store only needs one.
AnyRedis = redis.Redis | redis.asyncio.Redis


def _script_source(name: str) -> str:
    # ring.lua holds the context and helpers every script shares.
    return lua_source("dispatcher", "ring") + "\n" + lua_source("dispatcher", name)


# The shebang makes Redis (7.0+) check for out-of-memory before the script
# starts, not at each write inside it: a batch is refused whole, never cut.
_ENQUEUE_SOURCE = "#!lua\n" + _script_source("enqueue")


@dataclass(frozen=True)
class StoreLimits:
    """The defaults a tenant without an override gets."""

    default_weight: int = 1
    default_cap: int = 20
    lease_ms: int = 30_000
    inflight_ttl_ms: int = 1_800_000
    stranded_after_ms: int = 1_800_000 + 86_400_000 + 60_000 + 900_000
    """A dispatched job without progress this long is stranded (Settings.stranded_after_seconds)."""
    min_replicas: int = 0
    """Replicas an enqueue and a "sent" record wait for (FAIRPOST_REDIS_MIN_REPLICAS)..."""
    wait_ms: int = 1000
    """... for at most this long (FAIRPOST_REDIS_WAIT_SECONDS)."""

    @property
    def durability(self) -> Durability:
        return Durability(self.min_replicas, self.wait_ms)


def store_limits(settings: Settings) -> StoreLimits:
    return StoreLimits(
        default_weight=settings.default_weight,
        default_cap=settings.inflight_cap,
        lease_ms=int(settings.dispatcher.lease_seconds * 1000),
        inflight_ttl_ms=int(settings.dispatcher.inflight_ttl_seconds * 1000),
        stranded_after_ms=int(settings.stranded_after_seconds() * 1000),
        min_replicas=settings.redis_min_replicas,
        wait_ms=int(settings.redis_wait_seconds * 1000),
    )


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue; ``fields`` are extra record fields (strings)."""

    id: str
    tenant: str
    kind: str
    payload: str
    priority: str = "normal"
    fields: Mapping[str, str] | None = None
    send_at_ms: int = 0
    """When it may be sent (Redis server time, ms); 0 or a past time: now."""
    idempotency_key: str | None = None
    """A second job of the tenant with this key, within ``idempotency_ttl``, is not written."""
    idempotency_ttl: int = 86_400
    content: bytes | None = None
    """Stored beside the record under :meth:`Keys.content` (a claim check)."""


class ScriptCalls:
    """Builds the KEYS and ARGV of each script; shared by the sync and async stores."""

    def __init__(self, keys: Keys, limits: StoreLimits) -> None:
        self.keys = keys
        self.limits = limits

    def ring_keys(self) -> list[str]:
        k = self.keys
        return [
            k.ring(),
            k.ring_members(),
            k.blocked(),
            k.caps(),
            k.wake(),
            k.paused(),
            k.backlogs(),
            k.expiring(),
            k.totals(),
        ]

    def ring_args(self) -> list[str | int]:
        return [self.keys.queue_prefix(), self.keys.inflight_prefix(), self.limits.default_cap]

    def enqueue(self, jobs: Sequence[NewJob]) -> tuple[list[str], list[str | int | bytes]]:
        """One call for the whole batch (enqueue.lua): all or nothing."""
        k = self.keys
        keys = [*self.ring_keys(), k.tenants(), k.scheduled()]
        args: list[str | int | bytes] = [*self.ring_args(), len(jobs)]
        for job in jobs:
            fields: list[str | int | bytes] = ["kind", job.kind, "payload", job.payload]
            for name, value in (job.fields or {}).items():
                fields += [name, value]
            has_key = job.idempotency_key is not None
            idem = k.idempotency(job.tenant, job.idempotency_key) if job.idempotency_key else k.job(job.id)
            keys += [k.job(job.id), k.content(job.id), idem]
            args += [job.id, job.tenant, job.priority, job.send_at_ms]
            args += [job.idempotency_ttl if has_key else 0, job.content or b"", len(fields) // 2, *fields]
        return keys, args


class JobStore:
    """The asyncio side of the queues: what the dispatcher and sender use."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self.limits = limits
        self._calls = ScriptCalls(keys, limits)
        self._enqueue = client.register_script(_ENQUEUE_SOURCE)
        self._claim = client.register_script(_script_source("claim"))
        self._requeue = client.register_script(_script_source("requeue"))
        self._reap = client.register_script(_script_source("reap"))
        self._finish = client.register_script(_script_source("finish"))
        self._handoff = client.register_script(lua_source("dispatcher", "handoff"))
        self._touch = client.register_script(lua_source("dispatcher", "touch"))
        self._keep = client.register_script(lua_source("dispatcher", "keep"))
        self._renew = client.register_script(lua_source("dispatcher", "renew"))
        self._send_claim = client.register_script(lua_source("dispatcher", "send_claim"))
        self._dead_letter = client.register_script(lua_source("dispatcher", "dead_letter"))

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[bool]:
        """Enqueue jobs in one atomic call, all or nothing; False where nothing was
        written (the id existed, or the idempotency key was used already)."""
        return [written for written, _ in await self.submit(jobs)]

    async def submit(self, jobs: Sequence[NewJob]) -> list[tuple[bool, str]]:
        """Like :meth:`enqueue`, with the id each job resolved to: its own, or the
        first job's for a repeated idempotency key."""
        if not jobs:
            return []
        keys, args = self._calls.enqueue(jobs)
        durable = self.limits.durability
        if not durable.replicas:
            return [_submitted(r) for r in await self._enqueue(keys=keys, args=args)]
        # The job ids go back to the caller: only once replicas hold the jobs.
        async with self.redis.pipeline(transaction=False) as pipe:
            await self._enqueue(keys=keys, args=args, client=pipe)
            [results] = await self.execute_durably(pipe)
        return [_submitted(r) for r in results]

    async def claim(self, count: int) -> list[Job]:
        """Claim up to ``count`` jobs, fairly across tenants, each under a lease."""
        c = self._calls
        flat: list[Any] = await self._claim(
            keys=[*c.ring_keys(), self.keys.deficit(), self.keys.weights(), self.keys.leases()],
            args=[
                *c.ring_args(),
                count,
                self.limits.default_weight,
                self.limits.lease_ms,
                self.keys.job_prefix(),
                self.limits.inflight_ttl_ms,
            ],
        )
        return [
            Job(
                id=_s(flat[i]),
                tenant=_s(flat[i + 1]),
                kind=_s(flat[i + 2]),
                payload=_s(flat[i + 3]),
                attempts=int(flat[i + 4]),
                created_ms=int(flat[i + 5]),
                replays=int(flat[i + 6]),
            )
            for i in range(0, len(flat), 7)
        ]

    async def handed_off(self, job_ids: Sequence[str]) -> int:
        """Record that jobs reached their downstream; returns the server time (ms)."""
        if not job_ids:
            return 0
        k = self.keys
        now: int = await self._handoff(
            keys=[k.leases(), k.dispatched()],
            args=[
                k.job_prefix(),
                k.queue_prefix(),
                k.inflight_prefix(),
                self.limits.inflight_ttl_ms,
                self.limits.stranded_after_ms,
                *job_ids,
            ],
        )
        return int(now)

    async def renew(self, job_ids: Sequence[str]) -> int:
        """Extend the leases of claims still being worked on by one lease from now."""
        if not job_ids:
            return 0
        k = self.keys
        count: int = await self._renew(
            keys=[k.leases()],
            args=[k.job_prefix(), k.inflight_prefix(), self.limits.lease_ms, *job_ids],
        )
        return int(count)

    async def requeue(self, job_ids: Sequence[str]) -> int:
        """Give claimed jobs back to the head of their queues."""
        if not job_ids:
            return 0
        c = self._calls
        count: int = await self._requeue(
            keys=[*c.ring_keys(), self.keys.leases()],
            args=[*c.ring_args(), self.keys.job_prefix(), *job_ids],
        )
        return int(count)

    async def reap(self, max_leases: int = 500) -> int:
        """Return expired leases to their queues; drop expired in-flight slots and
        unblock their tenants. At most ``max_leases`` leases and as many tenants a call."""
        c = self._calls
        count: int = await self._reap(
            keys=[*c.ring_keys(), self.keys.leases()],
            args=[*c.ring_args(), self.keys.job_prefix(), max_leases],
        )
        return int(count)

    async def finish(
        self,
        job_id: str,
        state: JobState,
        *,
        keep_seconds: int = 0,
        fields: Mapping[str, str | int] | None = None,
        pipeline: redis.asyncio.client.Pipeline | None = None,
    ) -> int:
        """End a job as sent or dead and free its tenant's in-flight slot.

        Returns 1, 0 when the job was already sent (nothing changed), -1 if unknown.
        With ``pipeline`` the call is only queued on it (returns 0): its result
        comes from the caller's ``execute()``, in one round trip with the rest.
        """
        c = self._calls
        extra: list[str | int] = []
        for name, value in (fields or {}).items():
            extra += [name, value]
        result: int = await self._finish(
            keys=[
                *c.ring_keys(),
                self.keys.job(job_id),
                self.keys.leases(),
                self.keys.dead(),
                self.keys.content(job_id),
                self.keys.dispatched(),
            ],
            args=[*c.ring_args(), job_id, state.value, keep_seconds, *extra],
            client=pipeline,  # None: the store's own client, at once
        )
        return 0 if pipeline is not None else int(result)

    async def touch_inflight(self, tenant: str, until_ms: int) -> None:
        """Keep the tenant's in-flight slots while its mail waits in SQS for its quota."""
        margin = self.limits.stranded_after_ms - self.limits.inflight_ttl_ms
        await self._touch(keys=[self.keys.inflight(tenant), self.keys.dispatched()], args=[until_ms, margin])

    async def keep_inflight(self, keep_ms: int, due_ms: int, offset: int, page: int) -> tuple[int, int, int]:
        """Renew, to ``keep_ms`` from now, the live in-flight slots of tenants whose
        earliest slot expires within ``due_ms``: their mail waits in SQS while no
        sender receives (mailer/daemon/slots.py). One page of tenants from
        ``offset``; returns (tenants visited, of them still due, slots kept)."""
        margin = self.limits.stranded_after_ms - self.limits.inflight_ttl_ms
        reply = await self._keep(
            keys=[self.keys.expiring(), self.keys.dispatched()],
            args=[self.keys.inflight_prefix(), keep_ms, due_ms, margin, offset, page],
        )
        visited, stayed, kept = (int(v) for v in reply)
        return visited, stayed, kept

    async def wait_for_work(self, seconds: float) -> bool:
        """Block on Redis until something may be claimable, or ``seconds`` pass."""
        # BLPOP's timeout is in seconds with sub-second precision on Redis ≥ 6.
        result = await self.redis.blpop([self.keys.wake()], timeout=max(seconds, 0.01))
        return result is not None

    async def job(self, job_id: str) -> dict[str, str]:
        raw: dict[Any, Any] = await self.redis.hgetall(self.keys.job(job_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    # -- what a sender records about a job (mailer/daemon) -----------------------

    def pipeline(self) -> redis.asyncio.client.Pipeline:
        """A pipeline on the store's client, for calls queued with ``pipeline=``."""
        return self.redis.pipeline(transaction=False)

    async def execute_durably(self, pipe: redis.asyncio.client.Pipeline) -> list[Any]:
        """Execute writes the product relies on (an enqueue, a "sent" record): their
        results, once FAIRPOST_REDIS_MIN_REPLICAS replicas hold them (dispatcher.durable);
        :class:`NotReplicated` if they do not in time."""
        durable = self.limits.durability
        durable.queue_wait(pipe)
        return durable.check(await pipe.execute())

    async def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Each job's state, in one round trip; a job without a record is left out."""
        async with self.pipeline() as pipe:
            for job_id in job_ids:
                pipe.hget(self.keys.job(job_id), "state")
            values = await pipe.execute()
        return {job_id: _s(v) for job_id, v in zip(job_ids, values, strict=True) if v is not None}

    async def claim_sending(self, job_ids: Sequence[str], lifetime_ms: int) -> list[int]:
        """Take each job's sending marker (send_claim.lua): 1 taken, 0 another sender
        holds it, 2 the job is final already, 3 it has no record."""
        if not job_ids:
            return []
        keys = [self.keys.job(i) for i in job_ids] + [self.keys.sending(i) for i in job_ids]
        codes: list[Any] = await self._send_claim(keys=keys, args=[lifetime_ms])
        return [int(c) for c in codes]

    async def release_sending(self, job_id: str) -> None:
        await self.redis.delete(self.keys.sending(job_id))

    async def contents(self, job_ids: Sequence[str]) -> list[bytes | None]:
        """The stored content (a claim check) of each job, None where it is gone."""
        async with self.pipeline() as pipe:
            for job_id in job_ids:
                pipe.get(self.keys.content(job_id))
            values: list[bytes | None] = await pipe.execute()
        return values

    async def count_throttled(self, job_ids: Sequence[str]) -> None:
        """The jobs waited for a quota once more (not an attempt)."""
        async with self.pipeline() as pipe:
            for job_id in job_ids:
                pipe.hincrby(self.keys.job(job_id), "throttled", 1)
            await pipe.execute()

    async def count_attempt(self, job_id: str, error: str) -> int:
        """A send of the job failed: count it and keep the error; returns the attempts."""
        async with self.pipeline() as pipe:
            pipe.hincrby(self.keys.job(job_id), "attempts", 1)
            pipe.hset(self.keys.job(job_id), "last_error", error)
            attempts, _ = await pipe.execute()
        return int(attempts)

    async def record_sent(
        self,
        sent: Sequence[tuple[str, str]],
        *,
        keep_seconds: int,
        pipeline: redis.asyncio.client.Pipeline,
    ) -> None:
        """Queue on ``pipeline``: each (job id, SES message id) ends sent, its
        sending marker released."""
        for job_id, message_id in sent:
            await self.finish(
                job_id,
                JobState.SENT,
                keep_seconds=keep_seconds,
                fields={"ses_message_id": message_id},
                pipeline=pipeline,
            )
        for job_id, _ in sent:
            pipeline.delete(self.keys.sending(job_id))

    async def record_dead(
        self, job_id: str, tenant: str, reason: str, raw_body: str, *, keep_seconds: int
    ) -> None:
        """A dead letter for a job without a record (expired, lost, or an unreadable
        message that names none): written whole (dead_letter.lua), so it can be
        listed and read."""
        await self._dead_letter(
            keys=[self.keys.job(job_id), self.keys.dead()],
            args=[job_id, tenant, reason, raw_body[:262_144], keep_seconds],
        )

    async def now_ms(self) -> int:
        """Redis's time: the one clock every stored time is read from."""
        seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def sync_tenant_settings(self, weights: Mapping[str, int], caps: Mapping[str, int]) -> None:
        """Publish per-tenant weights and caps where the scripts read them: exactly
        these (the configuration is the source of truth; a tenant whose weight or
        cap was removed from it falls back to the defaults). Live overrides
        (limits, pauses) are kept elsewhere and are not touched."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.weights(), self.keys.caps())
            if weights:
                pipe.hset(self.keys.weights(), mapping={t: str(w) for t, w in weights.items()})
            if caps:
                pipe.hset(self.keys.caps(), mapping={t: str(c) for t, c in caps.items()})
            await pipe.execute()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _submitted(result: Any) -> tuple[bool, str]:
    code, job_id = result
    return int(code) == 1, _s(job_id)


class SyncJobStore:
    """The blocking side of the queues, for the SDK's :class:`MailClient`."""

    def __init__(self, client: redis.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self._calls = ScriptCalls(keys, limits)
        self._enqueue = client.register_script(_ENQUEUE_SOURCE)

    def enqueue(self, jobs: Sequence[NewJob]) -> list[bool]:
        return [written for written, _ in self.submit(jobs)]

    def submit(self, jobs: Sequence[NewJob]) -> list[tuple[bool, str]]:
        if not jobs:
            return []
        keys, args = self._calls.enqueue(jobs)
        durable = self._calls.limits.durability
        if not durable.replicas:
            return [_submitted(r) for r in self._enqueue(keys=keys, args=args)]
        # The job ids go back to the caller: only once replicas hold the jobs.
        with self.redis.pipeline(transaction=False) as pipe:
            self._enqueue(keys=keys, args=args, client=pipe)
            durable.queue_wait(pipe)
            [results] = durable.check(pipe.execute())
        return [_submitted(r) for r in results]

    def job(self, job_id: str) -> dict[str, str]:
        raw: dict[Any, Any] = self.redis.hgetall(self.keys.job(job_id))
        return {_s(k): _s(v) for k, v in raw.items()}
