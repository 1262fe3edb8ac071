"""Moving tenants between sending pools (#43): ``fairpost tenant move`` and ``client.pools()``.

A move never moves mail. The tenant's new mail goes to the new pool as soon as
every SDK has seen the directory change (:data:`~fairpost.mailer.sdk.directory.DIRECTORY_TTL`);
what waits in the old pool (queued, scheduled, in SQS) is sent from there, by the
old pool's SES, and nothing is ever in two pools. So nothing can be lost or sent
twice by the move itself, however it is interrupted.

What the tenant carries along is copied raw, key by key, never parsed: its live
limits and pause, its hold, its warm-up step (and that it was seen, so that no
default plan starts again), its suppression and unsubscribe lists and its
idempotency keys. Its
reputation (the guard's windows, SES's verdict, the deliverability counts) stays
with the pool it was earned in.

The steps, each recorded in the directory's move record before the next one, so
that running the move again after a kill resumes where it stopped:

1. ``copy``: the tenant's state copied to the new pool, then the directory placed;
2. ``placed``: once every SDK sees the new pool, suppressions and idempotency keys
   the old pool gained meanwhile are copied again;
3. ``draining``: the old pool still holds the tenant's mail; a later run (or
   ``wait``) finishes when it holds none, copying the suppressions its last
   bounces added, and clears the record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import redis

from fairpost.config import ConfigError, Settings
from fairpost.config.pools import pool_key_prefix, pool_names
from fairpost.dispatcher.replies import text, time_ms
from fairpost.mailer.errors import InvalidMail
from fairpost.mailer.sdk.connection import RedisOwner, timeouts
from fairpost.mailer.sdk.directory import DIRECTORY_TTL, Placement, PoolDirectory
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import check_tenant_id
from fairpost.mailer.sdk.pool_redis import SyncPoolRedis

__all__ = ["MoveReport", "Pools"]

Step = Literal["copy", "placed", "draining", "done"]
_Space = tuple[redis.Redis, MailKeys]
"""A pool's client (its slot's, on a Redis Cluster) and its keys."""
_MARGIN_MS = 500
"""Past the directory's TTL, before every SDK counts as having seen a move."""


@dataclass(frozen=True)
class MoveReport:
    tenant: str
    source: str
    target: str
    step: Step
    """``done``, or where a later run resumes (``draining``: mail still waits in ``source``)."""
    waiting: int = 0
    """The tenant's jobs still in the source pool (queued or in flight)."""

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "from": self.source, "to": self.target, "step": self.step,
                "waiting": self.waiting}  # fmt: skip


class Pools(RedisOwner):
    """Which pool each tenant is on, its fallback, and moves (blocking; SDK dependencies only)."""

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.directory = PoolDirectory(self.settings, self._redis, ttl=0.0)
        self._pools = SyncPoolRedis(self.settings, self._redis, **timeouts(self.settings))

    def close(self) -> None:
        self._pools.close()
        super().close()

    def placements(self) -> dict[str, str]:
        """Every tenant not on the default pool → its pool."""
        return self.directory.placements()

    def pool_of(self, tenant: str) -> str:
        return self.directory.pool_of(check_tenant_id(tenant))

    def placement(self, tenant: str) -> Placement:
        """The tenant's pool, fallback and whether its identities were found there."""
        return self.directory.placement(check_tenant_id(tenant))

    def fallback_of(self, tenant: str) -> str | None:
        return self.directory.placement(check_tenant_id(tenant)).fallback

    def set_fallback(self, tenant: str, pool: str | None, *, identities_checked: bool = False) -> None:
        """Let the tenant's new mail go through ``pool`` while its own pool's SES fails
        (None: never).

        This call asks no SES (the SDK has no AWS client): the fallback is followed only
        once the tenant's identities were found in that pool's SES. The daemon serving
        ``pool`` asks it (``GetEmailIdentity``) within seconds and marks the fallback
        verified or refused (mailer/daemon/fallback_checks.py); ``fairpost tenant
        fallback`` asks before it writes. ``identities_checked``: the caller has just
        asked that pool's SES itself, and the fallback counts as verified at once (the
        daemon asks again after ten minutes)."""
        tenant = check_tenant_id(tenant)
        if pool is not None and pool == self.pool_of(tenant):
            raise InvalidMail("fallback", f"{pool!r} is the tenant's own pool")
        self.directory.set_fallback(tenant, pool, verified=identities_checked and pool is not None)

    def move(
        self, tenant: str, to: str, *, wait: float = 0.0, sleep: Callable[[float], None] = time.sleep
    ) -> MoveReport:
        """Move the tenant's new mail to pool ``to`` (resumable, idempotent: run it again
        to go on after a kill, or to finish a drain). ``wait``: seconds to wait for the old
        pool to drain before reporting ``draining``."""
        tenant = check_tenant_id(tenant)
        self._known(to)
        state = self.directory.move(tenant)
        if state is None:
            current = self.directory.pool_of(tenant)
            if current == to:
                return MoveReport(tenant, to, to, "done")
            state = {"from": current, "to": to, "step": "copy"}
            self.directory.record_move(tenant, state)
        elif state["to"] != to:
            if state["step"] != "copy":
                raise ConfigError([(
                    "--to", f"tenant {tenant!r} is moving from {state['from']!r} to {state['to']!r}: "
                    f"finish that move first (tenant move {tenant} --to {state['to']})",
                )])  # fmt: skip
            if state["from"] == to:  # back where it was, before it was placed: nothing moved
                self.directory.record_move(tenant, None)
                return MoveReport(tenant, to, to, "done")
            state = {"from": state["from"], "to": to, "step": "copy"}
            self.directory.record_move(tenant, state)
        source, target = self._space(str(state["from"])), self._space(to)
        if state["step"] == "copy":
            self._copy_settings(tenant, source, target)
            self._merge(tenant, source, target)
            self.directory.place(tenant, to)
            state = {**state, "step": "placed", "placed_ms": self._now_ms()}
            self.directory.record_move(tenant, state)
        if state["step"] == "placed":
            # Until every SDK's cache has seen the move, mail (and its idempotency keys)
            # may still be written to the old pool: copied again once it cannot be.
            seen_ms = int(state["placed_ms"]) + int(DIRECTORY_TTL * 1000) + _MARGIN_MS
            remaining = seen_ms - self._now_ms()
            if remaining > 0:
                sleep(remaining / 1000)
            self._merge(tenant, source, target)
            state = {**state, "step": "draining"}
            self.directory.record_move(tenant, state)
        deadline = time.monotonic() + wait
        waiting = self._waiting(tenant, source)
        while waiting and time.monotonic() < deadline:
            sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            waiting = self._waiting(tenant, source)
        if waiting:
            return MoveReport(tenant, str(state["from"]), to, "draining", waiting)
        self._merge(tenant, source, target)  # the suppressions of its last bounces
        self.directory.record_move(tenant, None)
        return MoveReport(tenant, str(state["from"]), to, "done")

    def moving(self, tenant: str) -> MoveReport | None:
        """The tenant's move in progress, if any."""
        tenant = check_tenant_id(tenant)
        state = self.directory.move(tenant)
        if state is None:
            return None
        waiting = self._waiting(tenant, self._space(str(state["from"])))
        return MoveReport(tenant, str(state["from"]), str(state["to"]), state["step"], waiting)

    # -- the raw copies ----------------------------------------------------------------

    def _copy_settings(self, tenant: str, source: _Space, target: _Space) -> None:
        """What the operator set for the tenant, mirrored: the target ends as the source is."""
        (r, old), (w, new) = source, target
        scope = f"t:{tenant}"
        for key_of, field in ((MailKeys.limit_overrides, scope), (MailKeys.warmup, tenant)):
            value = r.hget(key_of(old), field)
            if value is None:
                w.hdel(key_of(new), field)
            else:
                w.hset(key_of(new), field, value)
        if r.sismember(old.paused(), tenant):
            w.sadd(new.paused(), tenant)
        else:
            w.srem(new.paused(), tenant)
        if r.sismember(old.warmup_known(), tenant) or r.sismember(old.tenants(), tenant):
            w.sadd(new.warmup_known(), tenant)  # seen before: no default plan starts over
        hold: dict[Any, Any] = r.hgetall(old.tenant_hold(tenant))
        ttl = r.pttl(old.tenant_hold(tenant))
        w.delete(new.tenant_hold(tenant))
        if hold and ttl > 0:
            w.hset(new.tenant_hold(tenant), mapping=hold)
            w.pexpire(new.tenant_hold(tenant), ttl)

    def _merge(self, tenant: str, source: _Space, target: _Space) -> None:
        """What only grows, added: the suppressed and unsubscribed addresses, the idempotency keys."""
        (r, old), (w, new) = source, target
        suppressed: dict[Any, Any] = r.hgetall(old.suppressed(tenant))
        for address, reason in suppressed.items():
            w.hsetnx(new.suppressed(tenant), address, reason)
        unsubscribed: dict[Any, Any] = r.hgetall(old.unsubscribed(tenant))
        for address, topics in unsubscribed.items():
            w.hsetnx(new.unsubscribed(tenant), address, topics)
        idem = old.idempotency(tenant, "")
        for key in r.scan_iter(match=idem + "*", count=1000):
            name = text(key)
            value, ttl = r.get(name), r.pttl(name)
            if value is not None and ttl > 0:
                w.set(new.idempotency(tenant, name[len(idem) :]), value, px=ttl, nx=True)

    def _waiting(self, tenant: str, source: _Space) -> int:
        """The tenant's jobs in the source pool: queued, and claimed or in SQS."""
        r, keys = source
        queued = r.hget(keys.counts(), tenant)
        return int(queued or 0) + int(r.zcard(keys.inflight(tenant)))

    def _space(self, pool: str) -> _Space:
        """The pool's client and keys."""
        return self._pools(pool), MailKeys(pool_key_prefix(self.settings, pool))

    def _known(self, pool: str) -> None:
        if pool not in pool_names(self.settings):
            raise ConfigError([("--to", f"no pool {pool!r}: one of {', '.join(pool_names(self.settings))}")])

    def _now_ms(self) -> int:
        return time_ms(self._redis.time())
