"""Webhook endpoints per tenant, for admin tools (what ``fairpost webhook`` uses).

An endpoint is a tenant's URL that gets that tenant's events (all, or the
types it names), signed with its secret (:mod:`.signing`), delivered by the
daemon (``mailer/daemon/webhooks``) from its own queue (:mod:`.deliveries`).
Its record is the hash :meth:`MailKeys.webhook_endpoint`; the secrets in it are
shown only once, by :meth:`Webhooks.add` and :meth:`Webhooks.rotate_secret`.

>>> with Webhooks() as hooks:
...     made = hooks.add("acme", "https://hooks.acme.example/fairpost", events=["mail.bounced"])
...     [e.url for e in hooks.list("acme")]
['https://hooks.acme.example/fairpost']
"""

from __future__ import annotations

import builtins
import contextlib
import json
import secrets as random_source
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from fairpost.config import Settings
from fairpost.config.pools import pool_settings
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id
from fairpost.dispatcher.replies import record, text, time_ms
from fairpost.mailer.errors import InvalidWebhook, UnknownEndpoint
from fairpost.mailer.sdk.connection import RedisOwner, timeouts
from fairpost.mailer.sdk.failures import redis_operation
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.deliveries import DeliveryCalls, script
from fairpost.mailer.sdk.outcomes.feed import EVENT_TYPES, readable, stream_id
from fairpost.mailer.sdk.outcomes.signing import new_secret
from fairpost.mailer.sdk.outcomes.urls import check_url
from fairpost.mailer.sdk.pool_redis import SyncPoolRedis

__all__ = ["Endpoint", "NewSecret", "Webhooks"]

_REPLAY_PAGE = 500


@dataclass(frozen=True)
class Endpoint:
    id: str
    tenant: str
    url: str
    events: tuple[str, ...]
    """The event types it gets; empty: every type."""
    enabled: bool
    created: datetime
    disabled_reason: str | None
    """``manual`` (disabled by an operator), ``gone`` (it answered 410), ``failing``
    (every attempt failed for FAIRPOST_WEBHOOK_DISABLE_AFTER); None while enabled."""
    failing_since: datetime | None
    pending: int
    """Deliveries waiting at it (due, in flight, or behind an earlier event of their job)."""
    oldest_pending: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "url": self.url,
            "events": list(self.events),
            "enabled": self.enabled,
            "created": self.created.isoformat(),
            "disabled_reason": self.disabled_reason,
            "failing_since": _iso(self.failing_since),
            "pending": self.pending,
            "oldest_pending": _iso(self.oldest_pending),
        }


@dataclass(frozen=True)
class NewSecret:
    """An endpoint's id and its secret, shown this once."""

    id: str
    secret: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "secret": self.secret}


class Webhooks(RedisOwner):
    """The webhook endpoints, for admin tools. Blocking; needs only the SDK's
    dependencies. Bad input raises :class:`InvalidWebhook` naming the field and
    writes nothing; an unknown endpoint :class:`UnknownEndpoint`."""

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.keys = MailKeys(self.settings.key_prefix)
        self._calls = DeliveryCalls(self.keys)
        self._replay = self._redis.register_script(script("replay"))
        # Sending pools (#43): each pool's deliveries read its own feed and endpoints, so
        # every endpoint is kept in every pool's keys too, with the same id and secret.
        self._pools = SyncPoolRedis(self.settings, self._redis, **timeouts(self.settings))
        self._mirrors = [
            Webhooks(pool_settings(self.settings, pool), redis_client=self._pools(pool))
            for pool in self.settings.pools
        ]

    def close(self) -> None:
        for mirror in self._mirrors:
            mirror.close()
        self._pools.close()
        super().close()

    @redis_operation("webhook: add", writes=True, repeatable=False)
    def add(self, tenant: str, url: str, *, events: Iterable[str] = ()) -> NewSecret:
        """Register an endpoint for the tenant's events (``events``: only these types)."""
        tenant = _tenant(tenant)
        types = _types(events)
        check_url(url, allow_private=self.settings.webhook.allow_private)
        endpoint, secret = "ep_" + random_source.token_hex(8), new_secret()
        fields: dict[Any, Any] = {
            "tenant": tenant, "url": url, "events": ",".join(types), "enabled": "1", "secret": secret,
            "created_ms": time_ms(self._redis.time()),
        }  # fmt: skip
        for pool in (self, *self._mirrors):
            with pool._redis.pipeline(transaction=True) as pipe:
                pipe.hset(pool.keys.webhook_endpoint(endpoint), mapping=fields)
                pipe.sadd(pool.keys.webhook_tenant(tenant), endpoint)
                pipe.sadd(pool.keys.webhook_endpoints(), endpoint)
                pipe.execute()
        return NewSecret(endpoint, secret)

    @redis_operation("webhook: list")
    def list(self, tenant: str | None = None) -> list[Endpoint]:
        """Every endpoint (of ``tenant`` only, if given), by tenant, then by when added."""
        key = self.keys.webhook_endpoints() if tenant is None else self.keys.webhook_tenant(_tenant(tenant))
        ids = sorted(text(m) for m in self._redis.smembers(key))
        found = [e for e in (self._read(i) for i in ids) if e is not None]
        return sorted(found, key=lambda e: (e.tenant, e.created, e.id))

    @redis_operation("webhook: show")
    def get(self, endpoint: str) -> Endpoint:
        found = self._read(endpoint)
        if found is None:
            raise UnknownEndpoint(endpoint)
        return found

    @redis_operation("webhook: remove", writes=True)
    def remove(self, endpoint: str) -> None:
        """Delete the endpoint and everything still queued for it."""
        tenant = self.get(endpoint).tenant
        k = self.keys
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(k.webhook_endpoint(endpoint), *self._calls.queue_keys(endpoint))
            pipe.srem(k.webhook_tenant(tenant), endpoint)
            pipe.srem(k.webhook_endpoints(), endpoint)
            pipe.zrem(k.webhook_ready(), endpoint)
            pipe.hdel(k.webhook_busy(), endpoint)
            pipe.execute()
        for mirror in self._mirrors:
            with contextlib.suppress(UnknownEndpoint):  # added before the pool was declared
                mirror.remove(endpoint)

    @redis_operation("webhook: enable", writes=True)
    def enable(self, endpoint: str) -> None:
        """Deliver again, starting with what waited while it was disabled (if its URL
        still passes the check ``add`` made: :class:`InvalidWebhook` if not)."""
        self._check_url(self.get(endpoint))
        k = self.keys
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(k.webhook_endpoint(endpoint), "enabled", "1")
            pipe.hdel(k.webhook_endpoint(endpoint), "disabled_reason", "disabled_ms", "failing_since_ms")
            pipe.zadd(k.webhook_ready(), {endpoint: 0})  # the claim drops it if nothing is due
            pipe.lpush(k.webhook_wake(), "1")
            pipe.ltrim(k.webhook_wake(), 0, 0)
            pipe.execute()
        for mirror in self._mirrors:
            with contextlib.suppress(UnknownEndpoint):
                mirror.enable(endpoint)

    @redis_operation("webhook: disable", writes=True)
    def disable(self, endpoint: str) -> None:
        """Deliver nothing more until enabled; new events are not queued meanwhile."""
        self.get(endpoint)
        now = time_ms(self._redis.time())
        with self._redis.pipeline(transaction=True) as pipe:
            fields: dict[Any, Any] = {"enabled": "0", "disabled_reason": "manual", "disabled_ms": now}
            pipe.hset(self.keys.webhook_endpoint(endpoint), mapping=fields)
            pipe.zrem(self.keys.webhook_ready(), endpoint)
            pipe.execute()
        for mirror in self._mirrors:
            with contextlib.suppress(UnknownEndpoint):
                mirror.disable(endpoint)

    @redis_operation("webhook: rotate-secret", writes=True, repeatable=False)
    def rotate_secret(self, endpoint: str) -> NewSecret:
        """A new secret; the previous one still signs too for FAIRPOST_WEBHOOK_ROTATION_OVERLAP."""
        key = self.keys.webhook_endpoint(endpoint)
        current = self._redis.hget(key, "secret")
        if current is None:
            raise UnknownEndpoint(endpoint)
        secret = new_secret()
        until = time_ms(self._redis.time()) + int(self.settings.webhook.rotation_overlap * 1000)
        rotated: dict[Any, Any] = {"secret": secret, "old_secret": text(current), "old_until_ms": until}
        self._redis.hset(key, mapping=rotated)
        for mirror in self._mirrors:
            if mirror._redis.exists(mirror.keys.webhook_endpoint(endpoint)):
                mirror._redis.hset(mirror.keys.webhook_endpoint(endpoint), mapping=rotated)
        return NewSecret(endpoint, secret)

    @redis_operation("webhook: attempts")
    def attempts(self, endpoint: str, limit: int = 50) -> builtins.list[dict[str, Any]]:
        """The endpoint's latest delivery attempts, newest first (docs/outcomes.md)."""
        self.get(endpoint)
        raw: Any = self._redis.lrange(self.keys.webhook_part(endpoint, "attempts"), 0, max(0, limit - 1))
        return [json.loads(text(r)) for r in raw]

    @redis_operation("webhook: replay", writes=True, repeatable=False)
    def replay(self, endpoint: str, since: datetime) -> int:
        """Queue the tenant's events since ``since`` (those of its types) at the endpoint
        again, with their original ids; returns how many. Events past the feed's
        retention are gone. At an event a newer fairpost wrote it stops, with
        :class:`~fairpost.mailer.errors.NewerFormat`."""
        if not isinstance(since, datetime) or since.tzinfo is None:
            raise InvalidWebhook("since", "must be a timezone-aware datetime (ISO 8601 with an offset)")
        target = self._check_url(self.get(endpoint))
        start, queued = stream_id(since), 0
        while True:
            page: Any = self._redis.xrange(self.keys.outcomes(), min=start, count=_REPLAY_PAGE)
            events, _, newer = readable(page)
            wanted = [
                e
                for e in events
                if e.tenant == target.tenant and (not target.events or e.type in target.events)
            ]
            if wanted:
                keys, args = self._calls.replay(endpoint, wanted)
                queued += max(0, int(self._replay(keys=keys, args=args)))
            if newer is not None:
                raise newer  # what came before it is queued; a newer fairpost replays the rest
            if len(page) < _REPLAY_PAGE:
                # Each pool's feed to its own copy of the endpoint.
                return queued + sum(m.replay(endpoint, since) for m in self._mirrors if m._read(endpoint))
            start = "(" + text(page[-1][0])

    def _check_url(self, endpoint: Endpoint) -> Endpoint:
        """The endpoint, if its URL still passes :func:`check_url` (a name may resolve
        elsewhere now, or the record may have been written past ``add``)."""
        check_url(endpoint.url, allow_private=self.settings.webhook.allow_private)
        return endpoint

    def _read(self, endpoint: str) -> Endpoint | None:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.webhook_endpoint(endpoint))
            pipe.zcard(self.keys.webhook_part(endpoint, "pending"))
            pipe.zrange(self.keys.webhook_part(endpoint, "pending"), 0, 0, withscores=True)
            raw, pending, oldest = pipe.execute()
        fields = record(raw)
        if not fields:
            return None
        return Endpoint(
            id=endpoint,
            tenant=fields["tenant"],
            url=fields["url"],
            events=tuple(t for t in fields.get("events", "").split(",") if t),
            enabled=fields.get("enabled") == "1",
            created=_moment(fields.get("created_ms")) or datetime.fromtimestamp(0, UTC),
            disabled_reason=None if fields.get("enabled") == "1" else fields.get("disabled_reason", "manual"),
            failing_since=_moment(fields.get("failing_since_ms")),
            pending=int(pending),
            oldest_pending=_moment(oldest[0][1]) if oldest else None,
        )


def _tenant(tenant: object) -> str:
    if not is_valid_tenant_id(tenant):
        raise InvalidWebhook("tenant", f"must be {TENANT_ID_RULE}, got {tenant!r}")
    assert isinstance(tenant, str)
    return tenant


def _types(events: Iterable[str]) -> list[str]:
    if isinstance(events, str):
        events = [events]
    types = list(dict.fromkeys(events))
    unknown = [t for t in types if t not in EVENT_TYPES]
    if unknown:
        raise InvalidWebhook("events", f"unknown event type {unknown[0]!r}: one of {', '.join(EVENT_TYPES)}")
    return types


def _moment(ms: object) -> datetime | None:
    if ms is None or ms == "":
        return None
    return datetime.fromtimestamp(float(text(ms)) / 1000, UTC)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
