"""The dispatch loop: claim fairly, route by kind, bound concurrency.

One loop per process. It claims a batch (the fair pick happens in Redis,
so replicas share one order), hands each kind's jobs to its worker in a
task, and blocks on Redis when there is nothing to claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from fairpost.dispatcher.backoff import OutageBackoff, done_before_stop, until_landed
from fairpost.dispatcher.jobs import Job, JobState
from fairpost.dispatcher.keys import WAKE_SCHEDULED
from fairpost.dispatcher.lifecycle import Lifecycle
from fairpost.dispatcher.linger import Linger
from fairpost.dispatcher.loop import OnError, forever
from fairpost.dispatcher.store import JobStore
from fairpost.dispatcher.worker import Dead, Done, HandedOff, Later, Outcome, Requeue, Worker

log = logging.getLogger("fairpost.dispatcher")

# A worker that keeps failing (its downstream is down) must not be fed the
# same jobs in a tight loop: their return to the queue is delayed.
_RETRY_DELAY_MIN = 0.5

CLAIM_BYTES_MOST = 512 * 1024
"""About the most payload one claim's answer carries. Redis builds the answer in the
client's output buffer, which counts toward ``maxmemory``: 50 jobs of 64 KB would be
3 MB over the high-water mark, and a ``volatile-*`` Redis would evict for it. So a
claim asks for as many jobs as this holds at the payload size seen so far (a hand-off
batch until one is seen), never more than ``batch_size``."""
_RETRY_DELAY_MAX = 30.0

_CANCELLED_WAIT_GRACE = 1.0
"""Seconds a cancelled wait for work is given to end before it is left to end by itself."""


class Dispatcher:
    def __init__(
        self,
        store: JobStore,
        workers: Sequence[Worker],
        *,
        concurrency: int = 100,
        batch_size: int = 10,
        reap_interval: float = 1.0,
        finished_ttl_seconds: int = 7 * 86400,
        max_outage_seconds: float = 60.0,
        linger_seconds: float = 0.0,
        on_error: OnError | None = None,
    ) -> None:
        """``on_error``: told of each failed turn of :meth:`run` (the daemon counts them)."""
        self.store = store
        self.on_error = on_error
        self.linger = Linger(linger_seconds)
        self.max_outage_seconds = max_outage_seconds
        self.workers: Mapping[str, Worker] = {w.kind: w for w in workers}
        self.concurrency = concurrency
        self.batch_size = batch_size
        self._payload_bytes: float | None = None
        """The size of the payloads claimed lately (a moving average); None: none yet."""
        # What one hand-off takes (an SQS batch: ten): a claim bigger than that is one
        # claim.lua call for several, and lingers only to fill its last one.
        self.hand_off_size = min(batch_size, max((w.max_batch for w in workers), default=batch_size))
        self.reap_interval = reap_interval
        self.finished_ttl_seconds = finished_ttl_seconds
        self._busy = 0
        self._slot_freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # Claimed and not yet settled, in claim order (dict as an ordered set).
        self._held: dict[str, None] = {}
        self._retry_delay = _RETRY_DELAY_MIN
        self._claim_token: str | None = None
        # The wait just timed out with no wake token (the next claim need not take
        # them), or one said a scheduled job is due (the promotion comes forward).
        self._tokens_taken = False
        self._promote_now = False
        self.claimed_total = 0
        # Renew held claims several times per lease, and at least every loop
        # turn's longest wait, so that a slow hand-off never loses its lease.
        self._renew_interval = min(store.limits.lease_ms / 4000, reap_interval)
        self._next_renew = 0.0
        self.lifecycle = Lifecycle(store.redis, store.keys, store.limits)

    @property
    def busy(self) -> int:
        """Jobs claimed by this process and not yet handed back."""
        return self._busy

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until ``stop`` is set; then stop claiming and return.

        Jobs still with workers are not waited for here: see :meth:`drain`.
        """
        due = [0.0, 0.0]  # the next reap, the next promotion

        async def step() -> None:
            due[:] = await self._step(*due, stop=stop)

        # Redis failing: claims already made come back when their leases end.
        await forever(
            "dispatcher",
            step,
            stop,
            backoff=OutageBackoff(self.max_outage_seconds),
            on_error=self.on_error,
        )

    async def _step(
        self, next_reap: float, next_promote: float, *, stop: asyncio.Event
    ) -> tuple[float, float]:
        """One turn of the loop: maintenance when due, then claim, or wait for work."""
        if self._held and time.monotonic() >= self._next_renew:
            # Before reaping: however late this turn comes, this replica's own
            # claims are renewed before it could reap them.
            await self.store.renew(list(self._held))
            self._next_renew = time.monotonic() + self._renew_interval
        if time.monotonic() >= next_reap:
            reaped = await self.store.reap()
            if reaped:
                log.warning("returned %d expired claims to their queues", reaped)
            next_reap = time.monotonic() + self.reap_interval
        if time.monotonic() >= next_promote:
            next_promote = time.monotonic() + await self._promote_due()
        free = self.concurrency - self._busy
        if free <= 0:
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), self.reap_interval)
            return next_reap, next_promote
        # A wake token the claim took may say a scheduled job is due before the one
        # the promotion waits for: then the turn ends without a wait, and the next one
        # promotes at once (a wait would last until the promotion's old time).
        if not await self.claim_batch() and not self._promote_now:
            until = min(next_reap, next_promote) - time.monotonic()
            self._woken(await self._wait_for_work(max(0.0, min(self.reap_interval, until)), stop))
        if self._promote_now:
            # A scheduled job due before the one the promotion waited for.
            next_promote, self._promote_now = 0.0, False
        return next_reap, next_promote

    async def claim_batch(self) -> bool:
        """One claim of up to a batch (the free slots allowing), lingering for company
        when its last hand-off is short, its jobs started with their workers. Returns whether
        to claim again at once: only after a full batch. A short one left the ring
        empty, and a tenant that joins it since pushes a wake token (ring.lua,
        ``activate``), which ends the loop's wait at once.

        Before a claim the wake tokens waiting are taken (unless a wait just timed out
        with none): the claim serves every tenant whose joining pushed one, so a token
        left behind would only wake the loop for a claim that finds nothing (187 of
        400 claims of the bench's drain did, BENCHMARKS.md).

        The loop's turn between its upkeep and its wait: tests/ops/test_redis_budget.py
        drives the dispatcher through it, turn by turn, to count its Redis commands."""
        wanted = min(self._claim_size(), self.concurrency - self._busy)
        if wanted <= 0:
            return False
        if not self._tokens_taken:
            self._woken(await self.store.take_wake_tokens())
        self._tokens_taken = False
        jobs = await self._claim(wanted)
        try:
            short = len(jobs) % self.hand_off_size
            if jobs and len(jobs) < wanted and short and self.linger.base > 0:
                # Work is trickling in: a moment's wait fills the last hand-off, and a
                # full one is one SQS call instead of several. A sleep, not a wait on the
                # wake list: Redis times a BLPOP out on its clock tick (1/hz, 100 ms by
                # default), so the linger would last up to twice as long. Claimed again
                # only if a tenant joined the ring meanwhile (its wake token).
                await asyncio.sleep(self.linger.seconds(self.hand_off_size - short))
                if self._woken(await self.store.take_wake_tokens()):
                    jobs += await self._claim(wanted - len(jobs))
        finally:
            # Leased to this process alone: they go to their workers even when the
            # second claim fails (its own jobs come with the next turn: _claim).
            if jobs:
                self.claimed_total += len(jobs)
                self._start(jobs)
        return len(jobs) >= wanted

    def _claim_size(self) -> int:
        """Jobs a claim asks for: :data:`CLAIM_BYTES_MOST` at the payload size seen."""
        if self._payload_bytes is None:
            return min(self.batch_size, self.hand_off_size)
        fits = int(CLAIM_BYTES_MOST // max(self._payload_bytes, 1.0))
        return max(1, min(self.batch_size, fits))

    def _woken(self, why: str | None) -> bool:
        """Wake tokens taken (None: none were): a scheduled one brings the promotion forward."""
        if why == WAKE_SCHEDULED:
            self._promote_now = True
        return why is not None

    async def settled(self) -> None:
        """Wait until every job started so far is settled (its outcome recorded)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _wait_for_work(self, seconds: float, stop: asyncio.Event) -> str | None:
        """Block on Redis for a wake (JobStore.wait_for_work), or until ``stop``: the
        shutdown waits for this task before it hands the claims back. A wake token
        the cancelled wait took is lost; another replica only waits out its own wait.

        A cancelled wait is given a moment to end, not its whole timeout: redis-py's
        asyncio client sometimes swallows the cancellation of a BLPOP and lets it
        run to its end (redis/redis-py#2028), which would hold a shutdown that long.
        Such a wait is left to end by itself (or with its client's close)."""
        waiting = asyncio.ensure_future(self.store.wait_for_work(seconds))
        try:
            await done_before_stop(waiting, stop)
        finally:
            if not waiting.done():
                waiting.cancel()
                await asyncio.wait({waiting}, timeout=_CANCELLED_WAIT_GRACE)
                if not waiting.done():
                    waiting.add_done_callback(_retrieve)
        if not waiting.done() or waiting.cancelled():
            return None
        why = waiting.result()
        # Timed out: none was waiting, and any there now is newer than the wait. Woken
        # by one: the others still wait for the claim's take (claim_batch).
        self._tokens_taken = why is None
        return why

    async def _claim(self, count: int) -> list[Job]:
        """Claim under a token of the claim's own. A claim that raised (Redis may
        have leased it jobs, and only its answer was lost) keeps its token for the
        next one: asked again, it answers the jobs it leased (claim.lua), which
        then go out at once instead of waiting a lease for the reaper."""
        if self._claim_token is None:
            self._claim_token = uuid.uuid4().hex
        jobs = await self.store.claim(count, token=self._claim_token)
        self._claim_token = None
        self.linger.claimed(len(jobs))
        if jobs:
            size = max(len(job.payload) for job in jobs)
            seen = self._payload_bytes
            self._payload_bytes = float(size) if seen is None else max(float(size), 0.8 * seen + 0.2 * size)
        return jobs

    async def drain(self, grace: float) -> None:
        """Let running workers finish within ``grace`` seconds, then cancel them
        and give every job still held back to its queue (and those of a claim
        whose answer was lost)."""
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._claim_token is not None:
            # A claim whose answer never came: what it leased (asked again for none
            # more) goes back too, not a lease later.
            self._held.update(dict.fromkeys(job.id for job in await self._claim(0)))
        if self._held:
            returned = await self.store.requeue(list(self._held))
            log.info("returned %d claimed jobs to their queues", returned)
            self._held.clear()

    # -- internals ---------------------------------------------------------

    async def _promote_due(self) -> float:
        """Move due scheduled jobs into their queues; returns the seconds until
        the next one is due, at most the reap interval (another process may
        schedule an earlier one meanwhile: its enqueue wakes an idle dispatcher)."""
        moved, due_in = await self.lifecycle.promote_due()
        if moved:
            log.debug("%d scheduled jobs are due", moved)
        return self.reap_interval if due_in is None else min(due_in, self.reap_interval)

    def _start(self, jobs: list[Job]) -> None:
        by_kind: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            by_kind[job.kind].append(job)
        for kind, group in by_kind.items():
            worker = self.workers.get(kind)
            size = worker.max_batch if worker else len(group)
            for start in range(0, len(group), size):
                batch = group[start : start + size]
                self._busy += len(batch)
                self._held.update(dict.fromkeys(job.id for job in batch))
                task = asyncio.create_task(self._work(worker, kind, batch), name=f"dispatch-{kind}")
                self._tasks.add(task)
                task.add_done_callback(functools.partial(self._done, count=len(batch)))

    def _done(self, task: asyncio.Task[None], count: int) -> None:
        self._tasks.discard(task)
        self._busy -= count
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("dispatch task failed", exc_info=task.exception())

    async def _work(self, worker: Worker | None, kind: str, jobs: list[Job]) -> None:
        try:
            outcomes: Sequence[Outcome]
            if worker is None:
                outcomes = [Dead(f"no worker registered for job kind {kind!r}")] * len(jobs)
            else:
                try:
                    outcomes = await worker.handle(jobs)
                except Exception as exc:
                    log.exception("worker %r failed on %d jobs", kind, len(jobs))
                    outcomes = [Requeue(f"{type(exc).__name__}: {exc}")] * len(jobs)
                if len(outcomes) != len(jobs):
                    raise RuntimeError(
                        f"worker {kind!r} returned {len(outcomes)} outcomes for {len(jobs)} jobs"
                    )
            await self._settle(jobs, outcomes)
        except Exception:
            # Not settled, and never will be by this task: stop renewing the claims,
            # so their leases lapse and the reaper returns the jobs. (A cancelled task
            # keeps them held: drain() gives them back at once.)
            for job in jobs:
                self._held.pop(job.id, None)
            raise

    async def _settle(self, jobs: list[Job], outcomes: Sequence[Outcome]) -> None:
        """Record each job's outcome; a job leaves ``_held`` only once Redis has it."""
        settled = list(zip(jobs, outcomes, strict=True))
        handed = [job.id for job, o in settled if isinstance(o, HandedOff)]
        retry = [job.id for job, o in settled if isinstance(o, Requeue)]
        # Settling steps run until Redis has them. Running one again is safe (a job
        # already handed off, finished or given back is left as it is: the scripts read
        # its state), and a job left held has its lease renewed while this process lives.
        record = functools.partial(self._record, settled, handed)
        await until_landed("recording outcomes", record, self.max_outage_seconds)
        for job in jobs:
            if job.id not in retry:
                self._held.pop(job.id, None)
        if retry:
            await asyncio.sleep(self._retry_delay)
            self._retry_delay = min(self._retry_delay * 2, _RETRY_DELAY_MAX)
            requeue = functools.partial(self.store.requeue, retry)
            await until_landed("requeueing jobs", requeue, self.max_outage_seconds)
            for job_id in retry:
                self._held.pop(job_id, None)
        elif handed:
            self._retry_delay = _RETRY_DELAY_MIN

    async def _record(self, settled: list[tuple[Job, Outcome]], handed: list[str]) -> None:
        # When the earliest of them was claimed: handed off within that claim's lease,
        # their slots keep what their claims gave them (handoff.lua).
        claimed_ms = min((job.claimed_ms for job, o in settled if isinstance(o, HandedOff)), default=0)
        await self.store.handed_off(handed, claimed_ms=claimed_ms)
        later: dict[tuple[float, str], list[tuple[Job, Later]]] = defaultdict(list)
        for job, outcome in settled:
            if isinstance(outcome, Later):
                later[(outcome.seconds, outcome.reason)].append((job, outcome))
        for (seconds, reason), deferred in later.items():
            entries = {job.id: o.entry for job, o in deferred if o.entry is not None}
            await self.store.defer(
                [job.id for job, _ in deferred], int(seconds * 1000), reason, entries=entries
            )
        for job, outcome in settled:
            if isinstance(outcome, Done):
                await self.store.finish(job.id, JobState.SENT, keep_seconds=self.finished_ttl_seconds)
            elif isinstance(outcome, Dead):
                log.warning("job dead: %s", outcome.reason, extra={"job_id": job.id, "tenant": job.tenant})
                await self.store.finish(
                    job.id,
                    JobState.DEAD,
                    keep_seconds=self.finished_ttl_seconds,
                    fields={"dead_reason": outcome.reason, "last_error": outcome.reason},
                )


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A wait left to end by itself: its answer or error, taken so that asyncio does
    not report it as never retrieved."""
    if not task.cancelled():
        task.exception()
