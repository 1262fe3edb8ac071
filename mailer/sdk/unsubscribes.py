"""A tenant's unsubscribes: which addresses stopped which topics of its notification mail.

Apart from the suppression lists (mailer/sdk/suppression.py: bounces and
complaints, every stream): an unsubscribed address still gets the tenant's
transactional mail, and other tenants' mail. Unsubscribed from every topic
(``*``), it gets no notification mail from the tenant at all.

One hash per tenant (:meth:`fairpost.mailer.sdk.keys.MailKeys.unsubscribed`): the
address in lower case → ``"<topics> <source> <ms>"``, the topics sorted and
comma-separated, or ``*``; the source (``link``, ``mailto``, ``admin``) and
Redis time of the last change. Every change goes through ``unsubscribe.lua``,
which appends a ``recipient.unsubscribed`` event to the outcome feed in the same
step when an address is unsubscribed; that unsubscribe is then counted in the
tenant's deliverability rollups (``unsubscribed``, mailer/sdk/rollups.py). The
sender asks with one ``HMGET`` per group (:func:`ask_unsubscribed`). This module
owns the format.

>>> with Unsubscribes() as unsubscribes:
...     unsubscribes.add("acme", "ada@example.com", topic="digest")
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import DEFAULT_POOL, pool_settings
from fairpost.dispatcher.calls import outcome_journal
from fairpost.dispatcher.journal import Journal, entry_args, journal_args, journal_keys
from fairpost.dispatcher.replies import Queued, text
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.errors import InvalidMail, InvalidSuppression
from fairpost.mailer.sdk.connection import RedisOwner, timeouts
from fairpost.mailer.sdk.directory import PoolDirectory
from fairpost.mailer.sdk.failures import redis_operation
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.pool_redis import SyncPoolRedis
from fairpost.mailer.sdk.rollups import UNSUBSCRIBED, Deliverability, count_outcome
from fairpost.mailer.sdk.streams import TOPIC_RULE, check_topic
from fairpost.mailer.sdk.suppression import checked_address, checked_tenant, normalize

__all__ = ["EVERY_TOPIC", "Unsubscribe", "Unsubscribes", "ask_unsubscribed", "holds", "unsubscribe_call"]

EVERY_TOPIC = "*"
SOURCES = ("link", "mailto", "admin")


@dataclass(frozen=True)
class Unsubscribe:
    """Why an address is held from a tenant's notification mail."""

    address: str
    topics: tuple[str, ...]
    """The topics it stopped, or ``("*",)``: every topic."""
    source: str
    """How the last change came: ``link`` (one-click), ``mailto``, ``admin``."""
    since: datetime | None

    def to_json(self) -> dict[str, Any]:
        since = None if self.since is None else self.since.isoformat()
        return {"address": self.address, "topics": list(self.topics), "source": self.source, "since": since}


def _parse(address: str, value: str) -> Unsubscribe:
    topics, source, ms = ([*value.split(" "), "", ""])[:3]
    since = datetime.fromtimestamp(int(ms) / 1000, tz=UTC) if ms.isdigit() else None
    return Unsubscribe(address, tuple(topics.split(",")), source, since)


def holds(value: Any, topic: str | None) -> bool:
    """Whether a stored value (an ``HMGET`` answer) stops mail of ``topic``."""
    if value is None or topic is None:
        return False
    topics = text(value).split(" ", 1)[0]
    return topics == EVERY_TOPIC or topic in topics.split(",")


def ask_unsubscribed(
    pipe: redis.asyncio.client.Pipeline, keys: MailKeys, tenant: str, addresses: Sequence[str]
) -> Queued[list[Any]]:
    """Each address's stored value (None: not unsubscribed), queued on ``pipe`` beside
    the sender's other reads; read with :func:`holds`."""
    if not addresses:
        return Queued(0, lambda _: [])
    pipe.hmget(keys.unsubscribed(tenant), [normalize(a) for a in addresses])
    return Queued(1, lambda replies: list(replies[0]))


def unsubscribe_call(
    keys: MailKeys, journal: Journal | None, tenant: str, address: str, topic: str, *, add: bool, source: str
) -> tuple[list[str], list[str | int]]:
    """``unsubscribe.lua``'s KEYS and ARGV; the address normalized, the rest checked by the caller."""
    address = normalize(address)
    event = feed.entry(
        feed.UNSUBSCRIBED,
        {"recipient": address, "topic": None if topic == EVERY_TOPIC else topic, "source": source},
        tenant=tenant,
    )
    keys_ = [keys.unsubscribed(tenant), *journal_keys(journal)]
    args = [address, topic, "add" if add else "remove", source, *journal_args(journal), *entry_args(event)]
    return keys_, args


def unsubscribe_source() -> str:
    journal = lua_source("fairpost.dispatcher", "journal")
    return journal + "\n" + lua_source("fairpost.mailer.sdk", "unsubscribe")


def _topic(topic: str | None) -> str:
    if topic is None or topic == EVERY_TOPIC:
        return EVERY_TOPIC
    checked = check_topic(topic, "notification")
    assert checked is not None
    return checked


class Unsubscribes(RedisOwner):
    """A tenant's unsubscribes, for the application and admin tools (``fairpost
    unsubscribes``). Taking one back (:meth:`remove`) is re-subscription: record the
    recipient's consent first. Bad input raises
    :class:`fairpost.mailer.errors.InvalidSuppression` naming the field, and writes nothing."""

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.keys = MailKeys(self.settings.key_prefix)
        self._journal = outcome_journal(self.settings)
        self._script = self._redis.register_script(unsubscribe_source())
        # Sending pools (#43): a tenant's list is kept in the pool it is on, where its sender reads it.
        self._directory = PoolDirectory(self.settings, self._redis, ttl=0.0)
        self._pool_redis = SyncPoolRedis(self.settings, self._redis, **timeouts(self.settings))
        self._by_pool: dict[str, Unsubscribes] = {}

    def close(self) -> None:
        for other in self._by_pool.values():
            other.close()
        self._pool_redis.close()
        super().close()

    def _for(self, tenant: str) -> Unsubscribes:
        """This admin, or the one of the pool the tenant is on."""
        pool = self._directory.pool_of(checked_tenant(tenant)) if self.settings.pools else DEFAULT_POOL
        if pool == DEFAULT_POOL:
            return self
        if pool not in self._by_pool:
            own = pool_settings(self.settings, pool)
            self._by_pool[pool] = Unsubscribes(own, redis_client=self._pool_redis(pool))
        return self._by_pool[pool]

    @redis_operation("unsubscribes: list")
    def list(self, tenant: str) -> list[Unsubscribe]:
        """The tenant's unsubscribed addresses, sorted."""
        if (pool := self._for(tenant)) is not self:
            return pool.list(tenant)
        raw: dict[Any, Any] = self._redis.hgetall(self.keys.unsubscribed(checked_tenant(tenant)))
        return sorted((_parse(text(k), text(v)) for k, v in raw.items()), key=lambda u: u.address)

    def add(self, tenant: str, address: str, topic: str | None = None) -> bool:
        """Unsubscribe the address from ``topic`` (None: every topic); False if it was already."""
        if (pool := self._for(tenant)) is not self:
            return pool.add(tenant, address, topic)
        changed = self._add(tenant, address, topic)
        if changed and self.settings.deliverability.enabled:
            # Its own call after the unsubscribe: a retry of this one would count twice.
            Deliverability(self.settings, redis_client=self._redis).count(tenant, UNSUBSCRIBED, [address])
        return changed

    @redis_operation("unsubscribes: add", writes=True)
    def _add(self, tenant: str, address: str, topic: str | None) -> bool:
        return self._run(tenant, address, topic, add=True) == 1

    @redis_operation("unsubscribes: remove", writes=True)
    def remove(self, tenant: str, address: str, topic: str | None = None) -> bool:
        """Subscribe it again to ``topic`` (None: to everything); False if it was not unsubscribed."""
        if (pool := self._for(tenant)) is not self:
            return pool.remove(tenant, address, topic)
        changed = self._run(tenant, address, topic, add=False)
        if changed < 0:
            raise InvalidSuppression(
                "topic", "the address is unsubscribed from every topic: remove without a topic first"
            )
        return changed == 1

    def _run(self, tenant: str, address: str, topic: str | None, *, add: bool) -> int:
        try:
            checked = _topic(topic)
        except InvalidMail:
            raise InvalidSuppression("topic", f"must be {TOPIC_RULE} (None: every topic)") from None
        keys, args = unsubscribe_call(
            self.keys, self._journal, checked_tenant(tenant), checked_address(address), checked,
            add=add, source="admin",
        )  # fmt: skip
        return int(self._script(keys=keys, args=args))


async def unsubscribe(
    client: redis.asyncio.Redis, settings: Settings, tenant: str, address: str, topic: str, source: str
) -> bool:
    """What a recipient's one click (or mail) does: unsubscribed at once, its event in
    the feed, counted in the rollups; False if it was already."""
    keys_, args = unsubscribe_call(
        MailKeys(settings.key_prefix),
        outcome_journal(settings),
        tenant,
        address,
        topic,
        add=True,
        source=source,
    )
    changed = int(await client.register_script(unsubscribe_source())(keys=keys_, args=args)) == 1
    if changed and settings.deliverability.enabled:
        await count_outcome(client, settings, tenant, UNSUBSCRIBED, [address])
    return changed
