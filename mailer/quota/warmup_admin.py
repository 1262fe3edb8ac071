"""Live control of tenants' warm-up plans (what ``fairpost tenant warmup`` uses).

Every change is one call of ``warmup.lua``, at the Redis server's time; every
sender replica applies it at its next refresh of the overrides (within about
2 s), without a restart. See :mod:`fairpost.mailer.quota.warmup` for what a
place in a plan is.

This module needs only the SDK's dependencies (``redis``).
"""

from __future__ import annotations

import redis

from fairpost.config import Settings
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id
from fairpost.config.warmup import WarmupPlan, parse_plan
from fairpost.dispatcher.replies import time_ms
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.errors import InvalidOverride
from fairpost.mailer.quota.warmup import Place, WarmupView, read_places
from fairpost.mailer.sdk.connection import RedisOwner
from fairpost.mailer.sdk.failures import redis_operation
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["WarmupAdmin"]


def _check_tenant(tenant: object) -> str:
    if not is_valid_tenant_id(tenant):
        raise InvalidOverride("tenant", f"must be {TENANT_ID_RULE}, got {tenant!r}")
    assert isinstance(tenant, str)
    return tenant


def _check_plan(plan: str | WarmupPlan) -> WarmupPlan:
    if isinstance(plan, WarmupPlan):
        plan = str(plan)  # through the parser: what is stored is what it accepts
    try:
        return parse_plan(plan)
    except ValueError as exc:
        raise InvalidOverride("plan", str(exc)) from None


class WarmupAdmin(RedisOwner):
    """Set, restart, end and read tenants' warm-up plans, live.

    >>> with WarmupAdmin() as admin:
    ...     admin.set_plan("acme", "50/hour from 0s | 500/hour from 1 day | none from 7 days")
    ...     admin.skip("oldco")
    """

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.keys = MailKeys(self.settings.key_prefix)
        self._script = self._redis.register_script(lua_source("fairpost.mailer.quota", "warmup"))

    def _call(self, *args: str) -> object:
        keys = [self.keys.warmup(), self.keys.warmup_known(), self.keys.tenants()]
        return self._script(keys=keys, args=list(args))

    @staticmethod
    def _placed(reply: object) -> Place:
        place = Place.from_json(reply)
        assert place is not None, "warmup.lua wrote a place it cannot read"
        return place

    @redis_operation("warmup: set", writes=True)
    def set_plan(self, tenant: str, plan: str | WarmupPlan) -> Place:
        """Start ``plan`` for the tenant now (over any plan it had)."""
        tenant, parsed = _check_tenant(tenant), _check_plan(plan)
        return self._placed(self._call("set", tenant, str(parsed), "operator"))

    @redis_operation("warmup: set", writes=True)
    def use_default(self, tenant: str) -> Place:
        """Start the default plan (``FAIRPOST_WARMUP__PLAN``) for the tenant now."""
        tenant = _check_tenant(tenant)
        if self.settings.warmup.plan is None:
            raise InvalidOverride("plan", "there is no default plan (FAIRPOST_WARMUP__PLAN is empty)")
        return self._placed(self._call("set", tenant, str(self.settings.warmup.plan), "default"))

    @redis_operation("warmup: restart", writes=True)
    def restart(self, tenant: str) -> Place:
        """Start the tenant's current plan over, from its first step, now."""
        reply = self._call("restart", _check_tenant(tenant))
        if not reply:
            raise InvalidOverride("tenant", f"{tenant} is not warming up: give it a plan (or the default)")
        return self._placed(reply)

    @redis_operation("warmup: skip", writes=True)
    def skip(self, tenant: str) -> bool:
        """End the tenant's warm-up: its own limits apply; a default plan never starts for it
        again. False if it was not warming up."""
        return bool(self._call("skip", _check_tenant(tenant)))

    @redis_operation("warmup: read")
    def show(self, tenant: str | None = None) -> list[WarmupView]:
        """The warming tenants (or the one named, if it warms up), by id."""
        places = read_places(self._redis.hgetall(self.keys.warmup()))
        if tenant is not None:
            places = {t: p for t, p in places.items() if t == _check_tenant(tenant)}
        return [WarmupView(t, place) for t, (_, place) in sorted(places.items())]

    @redis_operation("warmup: read")
    def now_ms(self) -> int:
        """The Redis server's time, which every place is reckoned in."""
        return time_ms(self._redis.time())
