"""Reading the outcome feed with consumer groups: at least once, acknowledged, resumable.

``client.events(group="billing", consumer="w1")`` (:class:`EventReader`, and
:class:`AsyncEventReader` for asyncio) reads the feed as one of a group of
consumers: Redis Streams' ``XREADGROUP`` hands each event to one consumer of
the group, which acknowledges it with ``event.ack()`` (``XACK``) once it has
acted on it. An event read and never acknowledged stays the group's pending
work:

- a consumer that restarts under its own name reads its own pending events
  first (``XREADGROUP ... 0``), then new ones;
- any consumer of the group takes over events another one has left pending
  for ``claim_idle_seconds`` (``XAUTOCLAIM``): a consumer that crashed and
  never comes back loses nothing either.

So every event is read at least once, and one acknowledged is never read
again by that group. With ``tenant`` the reader sees only that tenant's
events, in a group of its own (``<group>@<tenant>``), which acknowledges the
other tenants' events as it passes them. A group that starts reads the feed
from its oldest event (``start="earliest"``) or from now (``"latest"``).
Events older than the feed's retention (``FAIRPOST_OUTCOMES__MAX_AGE`` and
``__MAX_LENGTH``) are gone, read or not: docs/outcomes.md.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id
from fairpost.dispatcher.replies import text
from fairpost.mailer.errors import InvalidInput, NewerFormat
from fairpost.mailer.sdk.failures import RedisFailures
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.feed import Outcome, from_entry

log = logging.getLogger("fairpost.outcomes")

__all__ = ["AsyncEvent", "AsyncEventReader", "Event", "EventReader", "Start"]

Start = Literal["earliest", "latest"]
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NAME_RULE = "1 to 64 characters from A-Z, a-z, 0-9, '.', '_' and '-'"


@dataclass(frozen=True)
class Event(Outcome):
    """An event read by :class:`EventReader`: acknowledge it with :meth:`ack` once acted on."""

    _ack: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def ack(self) -> None:
        """Done with it: the group never hands it out again."""
        assert self._ack is not None
        self._ack(self.id)


@dataclass(frozen=True)
class AsyncEvent(Outcome):
    """An event read by :class:`AsyncEventReader`: ``await event.ack()`` once acted on."""

    _ack: Callable[[str], Awaitable[None]] | None = field(default=None, repr=False, compare=False)

    async def ack(self) -> None:
        assert self._ack is not None
        await self._ack(self.id)


class _Core:
    """What both readers share, none of it I/O: names, where each read starts, and
    what its answer holds."""

    def __init__(
        self,
        settings: Settings,
        *,
        group: str,
        consumer: str,
        tenant: str | None,
        start: Start,
        batch: int,
        block: bool,
        claim_idle_seconds: float,
    ) -> None:
        for name, value in (("group", group), ("consumer", consumer)):
            if not isinstance(value, str) or not _NAME.fullmatch(value):
                raise InvalidInput(name, f"must be {_NAME_RULE}, got {value!r}")
        if tenant is not None and not is_valid_tenant_id(tenant):
            raise InvalidInput("tenant", f"must be {TENANT_ID_RULE}, got {tenant!r}")
        if start not in ("earliest", "latest"):
            raise InvalidInput("start", f"must be 'earliest' or 'latest', got {start!r}")
        if not 1 <= batch <= 10_000:
            raise InvalidInput("batch", "must be 1 to 10000")
        if claim_idle_seconds <= 0:
            raise InvalidInput("claim_idle_seconds", "must be above 0")
        self.key = MailKeys(settings.key_prefix).outcomes()
        # A filtered reader acknowledges other tenants' events: in a group of its own.
        self.group = group if tenant is None else f"{group}@{tenant}"
        self.consumer = consumer
        self.tenant = tenant
        self.first_id = "0" if start == "earliest" else "$"
        self.batch = batch
        self.block = block
        # A blocked read must end well before the client's socket timeout.
        self.block_ms = max(1, int(min(1.0, settings.redis_timeout / 2) * 1000))
        self.claim_idle_ms = int(claim_idle_seconds * 1000)
        self.failures = RedisFailures(settings)
        self.group_ready = False
        self.own_from: str | None = "0"
        """Where this consumer's own pending events are read from (after a restart);
        None once they are all read."""
        self.claim_cursor = "0-0"
        self.next_claim = 0.0

    def claimed(self, reply: Any) -> list[tuple[Any, Any]]:
        """XAUTOCLAIM's answer: the entries taken over; the next claim is due at
        once while there may be more, after half the idle time once the scan is done."""
        cursor, entries = text(reply[0]), list(reply[1])
        self.claim_cursor = cursor
        if cursor == "0-0":
            self.next_claim = time.monotonic() + self.claim_idle_ms / 2000
        return entries

    def own(self, reply: Any) -> list[tuple[Any, Any]]:
        entries = _entries(reply)
        self.own_from = text(entries[-1][0]) if entries else None
        return entries

    def split(self, entries: list[tuple[Any, Any]]) -> tuple[list[Outcome], list[str]]:
        """(the events to hand out, the ids to acknowledge unseen: trimmed away, of
        another tenant, or of a kind this fairpost does not know). An entry a newer
        fairpost wrote is neither: it stays pending in the group, unacknowledged, for
        a newer reader to claim (logged with both versions)."""
        events: list[Outcome] = []
        skip: list[str] = []
        for entry_id, fields in entries:
            try:
                event = from_entry(entry_id, fields)
            except NewerFormat as exc:
                log.warning("outcome feed entry %s: %s", text(entry_id), exc)
                continue
            if event is None or (self.tenant is not None and event.tenant != self.tenant):
                skip.append(text(entry_id))
            else:
                events.append(event)
        return events, skip


def _entries(reply: Any) -> list[tuple[Any, Any]]:
    """XREADGROUP's answer for the one stream read."""
    return list(reply[0][1]) if reply else []


class EventReader:
    """Iterates over the feed's events, blocking for new ones (``block=False``: until
    none is waiting). Made by :meth:`MailClient.events`."""

    def __init__(self, client: redis.Redis, settings: Settings, **options: Any) -> None:
        self._redis = client
        self._core = _Core(settings, **options)

    def __iter__(self) -> Iterator[Event]:
        while True:
            events, seen = self._read()
            yield from events
            if not seen and not self._core.block:
                return

    def read(self) -> list[Event]:
        """The next events (possibly none), without iterating."""
        return self._read()[0]

    def ack(self, *event_ids: str) -> None:
        if event_ids:
            core = self._core
            core.failures.call("events: ack", lambda: self._redis.xack(core.key, core.group, *event_ids))

    def _read(self) -> tuple[list[Event], int]:
        core = self._core
        call = core.failures.call
        if not core.group_ready:
            call("events: create group", self._create_group)
            core.group_ready = True
        entries: list[tuple[Any, Any]] = []
        if core.own_from is not None:
            own_from = core.own_from
            entries = core.own(
                call(
                    "events: read",
                    lambda: self._redis.xreadgroup(
                        core.group, core.consumer, {core.key: own_from}, count=core.batch
                    ),
                )
            )
        if not entries and time.monotonic() >= core.next_claim:
            entries = core.claimed(
                call(
                    "events: claim",
                    lambda: self._redis.xautoclaim(
                        core.key, core.group, core.consumer, core.claim_idle_ms, core.claim_cursor,
                        count=core.batch,
                    ),
                )
            )  # fmt: skip
        if not entries:
            block = core.block_ms if core.block else None
            entries = _entries(
                call(
                    "events: read",
                    lambda: self._redis.xreadgroup(
                        core.group, core.consumer, {core.key: ">"}, count=core.batch, block=block
                    ),
                )
            )
        events, skip = core.split(entries)
        self.ack(*skip)
        return [Event(e.id, e.type, e.timestamp, e.data, _ack=self.ack) for e in events], len(entries)

    def _create_group(self) -> None:
        core = self._core
        try:
            self._redis.xgroup_create(core.key, core.group, id=core.first_id, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


class AsyncEventReader:
    """The asyncio twin of :class:`EventReader` (``async for event in client.events(...)``)."""

    def __init__(self, client: redis.asyncio.Redis, settings: Settings, **options: Any) -> None:
        self._redis = client
        self._core = _Core(settings, **options)

    async def __aiter__(self) -> AsyncIterator[AsyncEvent]:
        while True:
            events, seen = await self._read()
            for event in events:
                yield event
            if not seen and not self._core.block:
                return

    async def read(self) -> list[AsyncEvent]:
        return (await self._read())[0]

    async def ack(self, *event_ids: str) -> None:
        if event_ids:
            core = self._core
            await core.failures.acall(
                "events: ack", lambda: self._redis.xack(core.key, core.group, *event_ids)
            )

    async def _read(self) -> tuple[list[AsyncEvent], int]:
        core = self._core
        call = core.failures.acall
        if not core.group_ready:
            await call("events: create group", self._create_group)
            core.group_ready = True
        entries: list[tuple[Any, Any]] = []
        if core.own_from is not None:
            own_from = core.own_from
            entries = core.own(
                await call(
                    "events: read",
                    lambda: self._redis.xreadgroup(
                        core.group, core.consumer, {core.key: own_from}, count=core.batch
                    ),
                )
            )
        if not entries and time.monotonic() >= core.next_claim:
            entries = core.claimed(
                await call(
                    "events: claim",
                    lambda: self._redis.xautoclaim(
                        core.key, core.group, core.consumer, core.claim_idle_ms, core.claim_cursor,
                        count=core.batch,
                    ),
                )
            )  # fmt: skip
        if not entries:
            block = core.block_ms if core.block else None
            entries = _entries(
                await call(
                    "events: read",
                    lambda: self._redis.xreadgroup(
                        core.group, core.consumer, {core.key: ">"}, count=core.batch, block=block
                    ),
                )
            )
        events, skip = core.split(entries)
        await self.ack(*skip)
        return [AsyncEvent(e.id, e.type, e.timestamp, e.data, _ack=self.ack) for e in events], len(entries)

    async def _create_group(self) -> None:
        core = self._core
        try:
            await self._redis.xgroup_create(core.key, core.group, id=core.first_id, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
