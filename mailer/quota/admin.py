"""Live quota changes, made by operators (``fairpost quota``, ``fairpost tenant``, the
console, the SDK's admin): overrides of the global and tenant limits, pauses and
resumes, each checked before it is written and read by every replica within
:data:`~fairpost.mailer.quota.overrides.REFRESH_SECONDS`
(:class:`~fairpost.mailer.quota.overrides.OverrideCache`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Limits, Window, format_limits, parse_limits
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id
from fairpost.dispatcher.calls import ScriptCalls, script, store_limits
from fairpost.mailer.errors import InvalidOverride
from fairpost.mailer.quota import holds
from fairpost.mailer.quota.overrides import (
    _TENANT_FIELD,
    GLOBAL_FIELD,
    EffectiveLimits,
    Overrides,
    read_auto_limits,
    read_overrides,
    resolve_global,
    resolve_tenant,
)
from fairpost.mailer.quota.provider_guard import hold_reason, lift_provider_holds
from fairpost.mailer.quota.reputation import lift_guard
from fairpost.mailer.sdk.connection import RedisOwner
from fairpost.mailer.sdk.failures import redis_operation
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.streams import split_group

log = logging.getLogger("fairpost.overrides")

__all__ = ["QuotaAdmin"]


def _check_tenant(tenant: object) -> str:
    if not is_valid_tenant_id(tenant):
        raise InvalidOverride("tenant", f"must be {TENANT_ID_RULE}, got {tenant!r}")
    assert isinstance(tenant, str)
    return tenant


def _check_scope(scope: object) -> str:
    """A tenant, or a tenant's stream (``acme:notification``: fairpost.mailer.quota.stream_limits)."""
    return scope if isinstance(scope, str) and split_group(scope) is not None else _check_tenant(scope)


def _check_limits(limits: str | Sequence[Window]) -> Limits:
    if isinstance(limits, str):
        try:
            return parse_limits(limits)
        except ValueError as exc:
            raise InvalidOverride("limits", str(exc)) from None
    windows = tuple(sorted(limits))
    if not windows or len({w.seconds for w in windows}) != len(windows):
        raise InvalidOverride("limits", "need at least one window, at most one of each length")
    # Round-trip through the text form, so what is stored is what the parser accepts.
    return _check_limits(format_limits(windows))


class QuotaAdmin(RedisOwner):
    """Live quota and tenant control for admin tools (what ``fairpost quota`` and
    ``fairpost tenant`` use). Changes reach every replica within about 5 s.

    >>> with QuotaAdmin() as admin:
    ...     admin.set_tenant_limits("acme", "100/minute; 5000/day")
    ...     admin.pause("noisy")
    """

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.keys = MailKeys(self.settings.key_prefix)
        self._calls = ScriptCalls(self.keys, store_limits(self.settings))
        self._resume = self._redis.register_script(script("resume"))

    # -- reading ------------------------------------------------------------------
    @redis_operation("quota: read")
    def overrides(self) -> Overrides:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.limit_overrides())
            pipe.smembers(self.keys.paused())
            raw, paused = pipe.execute()
        return read_overrides(raw, paused)

    @redis_operation("quota: read")
    def auto_limits(self) -> Limits | None:
        """The global limits a running daemon derived from SES, if the settings say ``auto``."""
        return read_auto_limits(self._redis.get(self.keys.auto_limits()))

    @redis_operation("quota: read")
    def global_limits(self) -> EffectiveLimits:
        auto = self.auto_limits() if isinstance(self.settings.global_limits, str) else None
        return resolve_global(self.settings, self.overrides(), auto)

    @redis_operation("quota: read")
    def tenant_limits(self, tenant: str) -> EffectiveLimits:
        return resolve_tenant(self.settings, self.overrides(), _check_tenant(tenant))

    @redis_operation("quota: read")
    def show(self, tenant: str | None = None) -> list[EffectiveLimits]:
        """The global limits and, for one tenant or for every tenant that has an
        override, own settings or a pause, the tenant's."""
        overrides = self.overrides()
        auto = self.auto_limits() if isinstance(self.settings.global_limits, str) else None
        result = [resolve_global(self.settings, overrides, auto)]
        if tenant is not None:
            tenants = [_check_tenant(tenant)]
        else:
            tenants = sorted(set(overrides.tenants) | set(self.settings.tenants) | overrides.paused)
        result += [resolve_tenant(self.settings, overrides, t) for t in tenants]
        return result

    # -- writing ------------------------------------------------------------------
    @redis_operation("quota: set", writes=True)
    def set_tenant_limits(self, tenant: str, limits: str | Sequence[Window]) -> Limits:
        """Override a tenant's limits (``"100/minute; 5000/day"``) until :meth:`reset_tenant_limits`."""
        field_name = _TENANT_FIELD + _check_scope(tenant)
        windows = _check_limits(limits)
        self._redis.hset(self.keys.limit_overrides(), field_name, format_limits(windows))
        return windows

    @redis_operation("quota: set", writes=True)
    def set_global_limits(self, limits: str | Sequence[Window]) -> Limits:
        """Override the global limits until :meth:`reset_global_limits`."""
        windows = _check_limits(limits)
        self._redis.hset(self.keys.limit_overrides(), GLOBAL_FIELD, format_limits(windows))
        return windows

    @redis_operation("quota: reset", writes=True)
    def reset_tenant_limits(self, tenant: str) -> bool:
        """Back to the settings; False if there was no override."""
        field_name = _TENANT_FIELD + _check_scope(tenant)
        return bool(self._redis.hdel(self.keys.limit_overrides(), field_name))

    @redis_operation("quota: reset", writes=True)
    def reset_global_limits(self) -> bool:
        return bool(self._redis.hdel(self.keys.limit_overrides(), GLOBAL_FIELD))

    @redis_operation("quota: pause", writes=True)
    def pause(self, tenant: str) -> bool:
        """Stop a tenant: nothing more is claimed or sent; its mail waits. False if already paused."""
        return bool(self._redis.sadd(self.keys.paused(), _check_tenant(tenant)))

    def resume(self, tenant: str) -> bool:
        """Let a held tenant send again at once: lifts every hold an operator may lift
        (:data:`fairpost.mailer.quota.holds.LIFTED_BY_RESUME`: a pause, the reputation
        guard's pause or throttle, after which the guard judges only what comes after,
        a disabled SES tenant's park and a hold for an SES fault of its own, which SES is
        asked about again when the tenant sends). False if it was held by none of these."""
        return bool(self.lift_holds(tenant))

    @redis_operation("quota: resume", writes=True)
    def lift_holds(self, tenant: str) -> list[str]:
        """:meth:`resume`, saying which holds it lifted (their reasons)."""
        tenant = _check_tenant(tenant)
        keys, args = self._calls.resume(tenant)
        lifted = ["paused"] if int(self._resume(keys=keys, args=args)) else []
        # A pause (or throttle) by the reputation guard is lifted too.
        guard = lift_guard(self._redis, self.keys, tenant)
        if guard is not None:
            # The guard's pause is the same set's: named as the guard's.
            lifted = [r for r in lifted if guard.level != "paused"] + ["reputation_" + guard.level]
        # Every replica brings back the mail of a tenant whose hold is gone
        # (mailer/daemon/holds.py, mailer/daemon/ses_tenant_status.py).
        # And the per-provider guard's holds, after which it too judges what comes after.
        providers = lift_provider_holds(self._redis, self.keys, tenant)
        lifted += [hold_reason(p) for p in providers]
        return lifted + holds.lift(self._redis, self.keys, tenant)

    @redis_operation("quota: read")
    def paused(self) -> list[str]:
        return sorted(self.overrides().paused)
