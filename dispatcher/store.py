"""Per-tenant job queues in Redis: enqueue, fair claim, hand-off, finish.

Every state change is one Lua script (the ``.lua`` files beside this
module), so a replica that dies between two calls leaves nothing half-done:
what it claimed comes back when its lease expires.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio
from redis.commands.core import AsyncScript

from fairpost.dispatcher.calls import (
    Call,
    ScriptCalls,
    StoreLimits,
    claimed,
    refused_when_full,
    script,
    store_limits,
    submitted,
)
from fairpost.dispatcher.history import History, SyncHistory
from fairpost.dispatcher.jobs import Job, NewJob
from fairpost.dispatcher.journal import Entry
from fairpost.dispatcher.keys import WAKE_SCHEDULED, WAKE_TOKENS_MOST, WAKE_WORK, Keys
from fairpost.dispatcher.record import job_record
from fairpost.dispatcher.replies import Queued, text, time_ms

# The store is where its callers find what they hand it (NewJob, StoreLimits).
__all__ = ["JobStore", "NewJob", "StoreLimits", "SyncJobStore", "store_limits"]


class JobStore:
    """The asyncio side of the queues: what the dispatcher and the workers use."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self.limits = limits
        self._calls = ScriptCalls(keys, limits)
        self._enqueue = client.register_script(script("enqueue"))
        self._claim = client.register_script(script("claim"))
        self._requeue = client.register_script(script("requeue"))
        self._reap = client.register_script(script("reap"))
        self._finish = client.register_script(script("finish"))
        self._handoff = client.register_script(script("handoff"))
        self._touch = client.register_script(script("touch"))
        self._keep = client.register_script(script("keep"))
        self._renew = client.register_script(script("renew"))
        self._dead_letter = client.register_script(script("dead_letter"))
        self._tenant_settings = client.register_script(script("tenant_settings"))
        self._attempt = client.register_script(script("attempt"))
        self._defer = client.register_script(script("defer"))
        self.history = History(client, keys)

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
        with refused_when_full(self.limits.high_water):
            if not durable.replicas:
                return [submitted(r) for r in await self._enqueue(keys=keys, args=args)]
            # The job ids go back to the caller: only once replicas hold the jobs.
            async with self.redis.pipeline(transaction=False) as pipe:
                await self._enqueue(keys=keys, args=args, client=pipe)
                [results] = await self.execute_durably(pipe)
        return [submitted(r) for r in results]

    async def claim(self, count: int, *, token: str | None = None) -> list[Job]:
        """Claim up to ``count`` jobs, fairly across tenants, each under a lease.

        ``token`` names the claim: asked again under the same token (its answer was
        lost on the way back), it answers the jobs it leased that are still leased to
        it, and claims nothing more. Without one, a claim of its own."""
        keys, args = self._calls.claim(count, token or uuid.uuid4().hex)
        return claimed(await self._claim(keys=keys, args=args))

    async def handed_off(self, job_ids: Sequence[str], *, claimed_ms: int = 0) -> int:
        """Record that jobs reached their downstream; returns the server time (ms).

        ``claimed_ms``: when the claims of these jobs were made, the earliest
        (:attr:`Job.claimed_ms`); handed off within that claim's lease, their
        in-flight slots keep what the claim gave them (0: not known, each is written)."""
        return await self._on_jobs(
            self._handoff, functools.partial(self._calls.handoff, claimed_ms=claimed_ms), job_ids
        )

    async def renew(self, job_ids: Sequence[str]) -> int:
        """Extend the leases of claims still being worked on by one lease from now."""
        return await self._on_jobs(self._renew, self._calls.renew, job_ids)

    async def requeue(self, job_ids: Sequence[str]) -> int:
        """Give claimed jobs back to the head of their queues."""
        return await self._on_jobs(self._requeue, self._calls.requeue, job_ids)

    async def _on_jobs(
        self, script: AsyncScript, call: Callable[[Sequence[str]], Call], job_ids: Sequence[str]
    ) -> int:
        """One script over some jobs, answering a number; no call (0) for no jobs."""
        if not job_ids:
            return 0
        keys, args = call(job_ids)
        return int(await script(keys=keys, args=args))

    async def reap(self, max_leases: int = 500) -> int:
        """Return expired leases to their queues; drop expired in-flight slots and
        unblock their tenants. At most ``max_leases`` leases and as many tenants a call."""
        keys, args = self._calls.reap(max_leases)
        return int(await self._reap(keys=keys, args=args))

    async def finish(
        self,
        job_id: str,
        state: str,
        *,
        keep_seconds: int = 0,
        fields: Mapping[str, str | int] | None = None,
        pipeline: redis.asyncio.client.Pipeline | None = None,
        entry: Entry | None = None,
    ) -> int:
        """End a job and free its tenant's in-flight slot: as :data:`JobState.SENT`,
        :data:`JobState.DEAD` (a dead letter, kept whole), or a final state of the
        caller's own (kept as a sent job is, its record only).

        Returns 1, 0 when the job was already sent (nothing changed), -1 if unknown.
        With ``pipeline`` the call is only queued on it (returns 0): its result
        comes from the caller's ``execute()``, in one round trip with the rest.
        ``entry``: what the job's journal entry adds (dispatcher/journal.py).
        """
        keys, args = self._calls.finish(
            [(job_id, fields)], state, keep_seconds, {job_id: entry} if entry else None
        )
        result = await self._finish(keys=keys, args=args, client=pipeline)  # None: at once
        return 0 if pipeline is not None else int(result[0])

    async def finish_all(
        self,
        jobs: Sequence[tuple[str, Mapping[str, str | int]]],
        state: str,
        *,
        keep_seconds: int,
        pipeline: redis.asyncio.client.Pipeline,
        entries: Mapping[str, Entry] | None = None,
    ) -> None:
        """Queue on ``pipeline``: each (job id, fields to set) ends as :meth:`finish`
        ends it, in one call for them all (its slots freed and each tenant made
        claimable again once); ``entries``: job id → what its journal entry adds."""
        if not jobs:
            return
        keys, args = self._calls.finish(jobs, state, keep_seconds, entries)
        await self._finish(keys=keys, args=args, client=pipeline)

    async def defer(
        self,
        job_ids: Sequence[str],
        wait_ms: int,
        reason: str,
        *,
        entries: Mapping[str, Entry] | None = None,
    ) -> list[int]:
        """Schedule claimed or dispatched jobs again ``wait_ms`` from now, waiting for
        ``reason`` (their slots freed, their leases or dispatched entries gone:
        defer.lua). Per job: 1 deferred, newly waiting for ``reason`` (its journal
        entry, from ``entries``, appended); 2 deferred, as it waited before; 0 left
        as it was (not leased nor dispatched, or one of its busy markers exists); -1 no record."""
        if not job_ids:
            return []
        keys, args = self._calls.defer(job_ids, wait_ms, reason, entries)
        return [int(r) for r in await self._defer(keys=keys, args=args)]

    async def touch_inflight(self, tenant: str, until_ms: int) -> None:
        """Keep the tenant's in-flight slots while its jobs wait downstream (touch.lua)."""
        keys, args = self._calls.touch(tenant, until_ms)
        await self._touch(keys=keys, args=args)

    async def keep_inflight(self, keep_ms: int, due_ms: int, offset: int, page: int) -> tuple[int, int, int]:
        """Renew, to ``keep_ms`` from now, the live in-flight slots of tenants whose
        earliest slot expires within ``due_ms``: their jobs wait downstream while no
        worker takes them (keep.lua). One page of tenants from
        ``offset``; returns (tenants visited, of them still due, slots kept)."""
        keys, args = self._calls.keep(keep_ms, due_ms, offset, page)
        visited, stayed, kept = (int(v) for v in await self._keep(keys=keys, args=args))
        return visited, stayed, kept

    async def wait_for_work(self, seconds: float) -> str | None:
        """Block on Redis until something may be claimable, or ``seconds`` pass: the
        wake token (:data:`~fairpost.dispatcher.keys.WAKE_WORK`,
        :data:`~fairpost.dispatcher.keys.WAKE_SCHEDULED`), None if none came.
        The others waiting stay for :meth:`take_wake_tokens`."""
        # BLPOP (not BLMPOP, whose keys a cluster client must ask the server for)
        # with a timeout in seconds, sub-second precision on Redis >= 6.
        result = await self.redis.blpop([self.keys.wake()], timeout=max(seconds, 0.01))
        return None if result is None else text(result[1])

    async def take_wake_tokens(self) -> str | None:
        """Every wake token waiting, taken without blocking: why they were pushed
        (:data:`~fairpost.dispatcher.keys.WAKE_SCHEDULED` if any says so, else
        :data:`~fairpost.dispatcher.keys.WAKE_WORK`); None if there were none (no
        tenant joined the ring since they were last taken).

        A tenant joining the ring pushes one (ring.lua), and one claim serves every
        tenant in it: taken before a claim, the tokens it serves do not each wake
        the dispatcher later for a claim that finds nothing."""
        tokens = await self.redis.lpop(self.keys.wake(), WAKE_TOKENS_MOST)
        if not isinstance(tokens, list) or not tokens:  # with a count, a list or None
            return None
        return WAKE_SCHEDULED if any(text(t) == WAKE_SCHEDULED for t in tokens) else WAKE_WORK

    async def job(self, job_id: str) -> dict[str, str]:
        """The job's record, its payload included (dispatcher/record.py); once a sent
        job's record has expired, what its line in the history keeps
        (dispatcher/history.py); empty if there is neither."""
        async with self.pipeline() as pipe:
            pipe.hgetall(self.keys.job(job_id))
            pipe.get(self.keys.payload(job_id))
            raw, payload = await pipe.execute()
        return job_record(raw, payload) or await self.history.record(job_id)

    # -- what a worker's downstream records about a job ---------------------------

    def pipeline(self) -> redis.asyncio.client.Pipeline:
        """A pipeline on the store's client, for calls queued with ``pipeline=``."""
        return self.redis.pipeline(transaction=False)

    async def execute_durably(self, pipe: redis.asyncio.client.Pipeline, *, lenient: int = -1) -> list[Any]:
        """Execute writes the product relies on (an enqueue, a "sent" record): their
        results, once FAIRPOST_REDIS_MIN_REPLICAS replicas hold them (fairpost.dispatcher.durable);
        :class:`NotReplicated` if they do not in time. ``lenient``: the number of a
        reply whose error is returned, not raised (what the writes do not depend on);
        -1: none."""
        durable = self.limits.durability
        durable.queue_wait(pipe)
        if lenient < 0:
            return durable.check(await pipe.execute())
        replies = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, Exception) and i != lenient:
                raise reply
        return durable.check(replies)

    async def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Each job's state, in one round trip; a job without a record is left out."""
        async with self.pipeline() as pipe:
            asked = self.ask_job_states(pipe, job_ids)
            return asked.take(iter(await pipe.execute()))

    def ask_job_states(
        self, pipe: redis.asyncio.client.Pipeline, job_ids: Sequence[str]
    ) -> Queued[dict[str, str]]:
        """:meth:`job_states`, queued on ``pipe`` beside the caller's other reads."""
        ids = list(job_ids)
        for job_id in ids:
            pipe.hget(self.keys.job(job_id), "state")
        return Queued(
            len(ids),
            lambda values: {job_id: text(v) for job_id, v in zip(ids, values, strict=True) if v is not None},
        )

    async def contents(self, job_ids: Sequence[str]) -> list[bytes | None]:
        """The content each job was enqueued with (:attr:`NewJob.content`, a claim
        check), None where it is gone."""
        async with self.pipeline() as pipe:
            for job_id in job_ids:
                pipe.get(self.keys.content(job_id))
            values: list[bytes | None] = await pipe.execute()
        return values

    async def count_attempt(self, job_id: str, error: str) -> int:
        """A send of the job failed: count it and keep the error; returns the attempts."""
        return int(await self._attempt(keys=[self.keys.job(job_id)], args=[error]))

    async def dead_letter(
        self,
        job_id: str,
        tenant: str,
        *,
        kind: str,
        reason: str,
        keep_seconds: int,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        """A dead letter for a job without a record, which its downstream still found
        (its record expired or lost, or a message that names none): written whole
        (dead_letter.lua), with ``fields`` of the caller's own, so it can be listed
        and read."""
        keys, args = self._calls.dead_letter(job_id, tenant, kind, reason, fields or {}, keep_seconds)
        await self._dead_letter(keys=keys, args=args)

    async def now_ms(self) -> int:
        """Redis's time: the one clock every stored time is read from."""
        return time_ms(await self.redis.time())

    async def sync_tenant_settings(self, weights: Mapping[str, int], caps: Mapping[str, int]) -> None:
        """Publish per-tenant weights and caps where the scripts read them: exactly
        these (the configuration is the source of truth; a tenant whose weight or
        cap was removed from it falls back to the defaults). Live overrides
        (limits, pauses) are kept elsewhere and are not touched."""
        args: list[str | int] = [len(weights)]
        for tenant, value in [*weights.items(), *caps.items()]:
            args += [tenant, value]
        await self._tenant_settings(keys=[self.keys.weights(), self.keys.caps()], args=args)


class SyncJobStore:
    """The blocking side of the queues, for the SDK's :class:`MailClient`."""

    def __init__(self, client: redis.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self.limits = limits
        self._calls = ScriptCalls(keys, limits)
        self._enqueue = client.register_script(script("enqueue"))
        self.history = SyncHistory(client, keys)

    def enqueue(self, jobs: Sequence[NewJob]) -> list[bool]:
        return [written for written, _ in self.submit(jobs)]

    def submit(self, jobs: Sequence[NewJob]) -> list[tuple[bool, str]]:
        if not jobs:
            return []
        keys, args = self._calls.enqueue(jobs)
        durable = self.limits.durability
        with refused_when_full(self.limits.high_water):
            if not durable.replicas:
                return [submitted(r) for r in self._enqueue(keys=keys, args=args)]
            # The job ids go back to the caller: only once replicas hold the jobs.
            with self.redis.pipeline(transaction=False) as pipe:
                self._enqueue(keys=keys, args=args, client=pipe)
                durable.queue_wait(pipe)
                [results] = durable.check(pipe.execute())
        return [submitted(r) for r in results]

    def job(self, job_id: str) -> dict[str, str]:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.job(job_id))
            pipe.get(self.keys.payload(job_id))
            raw, payload = pipe.execute()
        return job_record(raw, payload) or self.history.record(job_id)
