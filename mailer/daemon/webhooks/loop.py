"""The webhook tasks of ``fairpost run``: fan the feed out, deliver, retry.

- ``webhook-fanout`` follows the outcome feed and queues each event at its
  tenant's enabled endpoints that want its type (``fanout.lua``: in the feed's
  order, one batch at a time over every replica).
- ``webhooks`` claims due deliveries (``claim.lua``: fairly over endpoints, at
  most ``endpoint_concurrency`` in flight per endpoint over every replica, at
  most ``concurrency`` in this process), makes each attempt (:mod:`.post`) and
  settles it (``settle.lua``): a 2xx delivers it; 410 disables the endpoint;
  anything else is retried after the next step of FAIRPOST_WEBHOOK_RETRY_SCHEDULE
  (plus up to a tenth of it, or longer if the endpoint asked with
  ``Retry-After``), and given up once the schedule is spent. A claim is held
  under a lease longer than an attempt can last, so no event is delivered twice
  at once, whatever the replicas; a replica that dies leaves its claims to the
  reaper (``reap.lua``).

Each task runs on fairpost.dispatcher.loop: it survives any exception of a step
(logged, counted, backed off), until failures last FAIRPOST_MAX_OUTAGE_SECONDS:
then it raises and the daemon stops loudly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff, until_landed, wait_or_stop
from fairpost.dispatcher.loop import OnError, forever
from fairpost.dispatcher.replies import text, time_ms
from fairpost.mailer.daemon.webhooks.metrics import WebhookMetrics
from fairpost.mailer.daemon.webhooks.post import Answer, Poster
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.deliveries import Claimed, DeliveryCalls, claimed, script
from fairpost.mailer.sdk.outcomes.feed import iso_timestamp, readable
from fairpost.mailer.sdk.outcomes.signing import headers

__all__ = ["WebhookDeliveries"]

log = logging.getLogger("fairpost.webhooks")

LEASE_MARGIN_SECONDS = 30.0
"""A claim's lease outlasts the longest attempt (its timeout) by this much."""
ATTEMPTS_KEPT = 100
"""Attempt records kept per endpoint (``fairpost webhook attempts``)."""
_REAP_EVERY = 1.0
_MOST_WAIT = 0.5


class WebhookDeliveries:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        metrics: WebhookMetrics,
        *,
        batch: int = 500,
        on_error: OnError | None = None,
        on_newer: Callable[[str, int, int], None] = lambda what, found, reads: None,
    ) -> None:
        """``on_error``: told of each failed step of the tasks (the daemon counts them);
        ``on_newer``: of each look that met an event a newer fairpost wrote (format,
        its version, the newest this one reads)."""
        self.on_newer = on_newer
        self.redis = client
        self.on_error = on_error
        self.keys = keys
        self.settings = settings
        self.hooks = settings.webhook
        self.metrics = metrics
        self.batch = batch
        self.calls = DeliveryCalls(keys)
        self._fanout = client.register_script(script("fanout"))
        self._claim = client.register_script(script("claim"))
        self._settle = client.register_script(script("settle"))
        self._reap = client.register_script(script("reap"))
        self._running: set[asyncio.Task[None]] = set()
        self._poster: Poster | None = None
        self._next_reap = 0.0
        self.delivered = 0
        """Deliveries this process ended with a 2xx (tests wait on it)."""

    def tasks(self, stop: asyncio.Event) -> dict[str, asyncio.Task[None]]:
        return {
            "webhook-fanout": asyncio.create_task(self._forever("webhook-fanout", self._fanout_step, stop)),
            "webhooks": asyncio.create_task(self._forever("webhooks", self._delivery_step, stop)),
        }

    # -- the loops ---------------------------------------------------------------------

    async def _forever(
        self, name: str, step: Callable[[asyncio.Event], Awaitable[Any]], stop: asyncio.Event
    ) -> None:
        async def turn() -> None:
            await step(stop)

        backoff = OutageBackoff(self.settings.max_outage_seconds)
        try:
            await forever(name, turn, stop, backoff=backoff, on_error=self.on_error)
        finally:
            if name == "webhooks":
                await self.aclose()

    async def aclose(self) -> None:
        """Let the attempts under way end (each within its timeout), then close the pool."""
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._poster is not None:
            await self._poster.close()
            self._poster = None

    async def _fanout_step(self, stop: asyncio.Event) -> int:
        return await self.fanout_once(stop=stop)

    async def fanout_once(self, block_ms: int = 1000, stop: asyncio.Event | None = None) -> int:
        """Queue the next batch of the feed at its endpoints; with nothing new, wait up
        to ``block_ms`` for it. Returns the deliveries queued."""
        raw = await self.redis.get(self.keys.webhook_cursor())
        cursor = "" if raw is None else text(raw)
        if not await self.redis.scard(self.keys.webhook_endpoints()):
            return await self._pass_by(cursor, block_ms, stop)
        page: Any = await self.redis.xrange(
            self.keys.outcomes(), min="(" + cursor if cursor else "-", count=self.batch
        )
        if not page:
            await self.redis.xread({self.keys.outcomes(): cursor or "0-0"}, count=1, block=block_ms)
            return 0
        events, last, newer = readable(page)
        if newer is not None:
            # Written by a newer fairpost: the cursor stops before it, for a newer
            # replica's fan-out to take it on; this one looks again later.
            self.on_newer(newer.what, newer.found, newer.reads)
            log.warning("outcome feed: %s; the webhooks' fan-out waits for a newer fairpost", newer)
            if last is None:
                await wait_or_stop(stop or asyncio.Event(), block_ms / 1000)
                return 0
        assert last is not None  # a page read whole, or up to a newer entry after the first
        keys, args = self.calls.fanout(cursor, events, last)
        return max(0, int(await self._fanout(keys=keys, args=args)))

    async def _pass_by(self, cursor: str, block_ms: int, stop: asyncio.Event | None) -> int:
        """No endpoint anywhere: what the feed holds goes to nobody. The cursor moves
        past it unread (a mail's events are most of the feed's bytes: an application
        without webhooks must not pay for reading them), and the next look is
        ``block_ms`` later; an endpoint registered meanwhile gets what follows."""
        newest: Any = await self.redis.xrevrange(self.keys.outcomes(), count=1)
        last = text(newest[0][0]) if newest else cursor
        if last != cursor:
            keys, args = self.calls.fanout(cursor, None, last)
            if int(await self._fanout(keys=keys, args=args)) == -2:
                return 0  # an endpoint came meanwhile: the next look reads the batch for it
        await wait_or_stop(stop or asyncio.Event(), block_ms / 1000)
        return 0

    async def _delivery_step(self, stop: asyncio.Event) -> None:
        if time.monotonic() >= self._next_reap:
            keys, args = self.calls.reap(500)
            await self._reap(keys=keys, args=args)
            self._next_reap = time.monotonic() + _REAP_EVERY
        free = self.hooks.concurrency - len(self._running)
        if free > 0 and await self.deliver_due(free):
            return
        if free <= 0:
            await asyncio.wait(self._running, timeout=_MOST_WAIT, return_when=asyncio.FIRST_COMPLETED)
            return
        await self._wait_for_due()

    async def deliver_due(self, most: int) -> int:
        """Claim up to ``most`` due deliveries and start them; returns how many."""
        lease_ms = int((self.hooks.timeout_seconds + LEASE_MARGIN_SECONDS) * 1000)
        keys, args = self.calls.claim(most, self.hooks.endpoint_concurrency, lease_ms, max(16, most))
        taken = claimed(await self._claim(keys=keys, args=args))
        for delivery in taken:
            task = asyncio.create_task(self._deliver(delivery), name=f"webhook-{delivery.endpoint}")
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return len(taken)

    async def _wait_for_due(self) -> None:
        """Until a delivery may be due: a wake from a fan-out or a settle, or the
        earliest due time, or a moment (another replica may take the wake)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrange(self.keys.webhook_ready(), 0, 0, withscores=True)
            pipe.time()
            first, now = await pipe.execute()
        wait = _MOST_WAIT
        if first:
            wait = min(wait, max(0.01, (float(first[0][1]) - time_ms(now)) / 1000))
        await self.redis.blpop([self.keys.webhook_wake()], timeout=wait)

    # -- one attempt -------------------------------------------------------------------

    async def _deliver(self, delivery: Claimed) -> None:
        attempt = delivery.tries + 1
        moment = datetime.now(UTC)
        signed = headers(delivery.event_id, int(moment.timestamp()), delivery.body, delivery.secrets)
        answer = await self._poster_post(delivery.url, signed, delivery.body)
        self.metrics.attempted(answer.result, answer.seconds)
        outcome, wait = self._decide(answer, attempt)
        record = {
            "event_id": delivery.event_id, "type": delivery.type, "attempt": attempt,
            "at": iso_timestamp(moment), "result": answer.result, "status": answer.status,
            "duration_ms": int(answer.seconds * 1000), "error": answer.error, "response": answer.response,
            "response_bytes": answer.response_bytes, "response_sha256": answer.response_sha256,
            "next_attempt_in_seconds": wait if outcome == "retry" else None,
        }  # fmt: skip
        keys, args = self.calls.settle(
            delivery, outcome, retry_in_ms=int(wait * 1000), record=record,
            disable_after_ms=int(self.hooks.disable_after * 1000), kept=ATTEMPTS_KEPT,
        )  # fmt: skip
        disabled = await self._settle_landed(keys, args, delivery)
        extra = {"endpoint": delivery.endpoint, "tenant": delivery.tenant, "event_id": delivery.event_id}
        if outcome in ("delivered", "given_up"):
            self.metrics.ended(outcome)
        if outcome == "delivered":
            self.delivered += 1
        elif outcome == "given_up":
            log.warning(
                "webhook delivery to endpoint %s given up after %d attempts (%s)",
                delivery.endpoint,
                attempt,
                answer.error,
                extra=extra,
            )
        if disabled:
            self.metrics.endpoint_disabled(disabled)
            log.error(
                "webhook endpoint %s disabled: %s (last: %s)",
                delivery.endpoint,
                disabled,
                answer.error,
                extra=extra,
            )

    async def _poster_post(self, url: str, signed: dict[str, str], body: str) -> Answer:
        if self._poster is None:
            self._poster = Poster(self.settings)
        return await self._poster.post(url, signed, body)

    def _decide(self, answer: Answer, attempt: int) -> tuple[str, float]:
        """(settle outcome, seconds until the retry)."""
        if answer.result == "delivered":
            return "delivered", 0.0
        if answer.result == "gone":
            return "gone", 0.0
        schedule = self.hooks.retry_schedule
        if attempt > len(schedule):
            return "given_up", 0.0
        step = schedule[attempt - 1]
        wait = step + random.uniform(0, step / 10)
        if answer.retry_after is not None:
            # The endpoint's own ask, within the longest step of the schedule.
            wait = max(wait, min(answer.retry_after, max(schedule)))
        return "retry", wait

    async def _settle_landed(self, keys: list[str], args: list[str | int], delivery: Claimed) -> str:
        """Settle, riding out a Redis blip; a settle never landed leaves the claim to
        its lease, and the event is delivered again (at least once)."""
        settle = functools.partial(self._settle, keys=keys, args=args)
        try:
            result = await until_landed(
                "settling a webhook delivery", settle, self.settings.max_outage_seconds, first=0.2, most=2.0
            )
        except RedisError as exc:
            log.error("webhook delivery not settled (%s); its lease will bring it back", exc)
            return ""
        return "" if result is None else text(result)
