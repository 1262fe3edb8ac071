"""Live control of quotas and tenants, stored in Redis: no restart needed.

An operator (``fairpost quota …``, ``fairpost tenant …``) or an admin tool
(:class:`~fairpost.mailer.quota.admin.QuotaAdmin`) writes overrides; every sender replica reads them
through an :class:`OverrideCache`, refreshed every ``REFRESH_SECONDS``, so a
change applies everywhere within a few seconds. An override wins over the
settings until it is reset.

Keys (all from :class:`fairpost.mailer.sdk.keys.MailKeys`):

- ``limit_overrides()``: hash, ``"global"`` or ``"t:<tenant>"`` → limits text;
- ``paused()``: set of paused tenants, the one the dispatcher's scripts
  already honour (a paused tenant leaves the ring; its queue waits);
- ``auto_limits()``: the global limits a daemon derived from SES
  (``FAIRPOST_GLOBAL_LIMITS=auto``), published for the CLI to show;
- ``warmup()``: each warming tenant's place in its plan (:mod:`fairpost.mailer.quota.warmup`):
  while a tenant warms up, the cache folds its step into its limits, the stricter
  window by window, from the moment the step is due.

A paused tenant's mail already in SQS is not sent either: the sender holds
it (fairpost.mailer.daemon.holds) until the tenant is resumed; a resume lifts
every hold an operator may lift (fairpost.mailer.quota.holds.LIFTED_BY_RESUME).

This module needs only the SDK's dependencies (``redis``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import redis
import redis.asyncio

from fairpost.config import ConfigError, Settings
from fairpost.config.limits import Limits, Window, format_limits, parse_limits
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.loop import OnError, forever
from fairpost.dispatcher.replies import record, text, time_ms
from fairpost.mailer.quota.warmup import PENDING, Warmups
from fairpost.mailer.sdk.keys import MailKeys

__all__ = [
    "REFRESH_SECONDS",
    "EffectiveLimits",
    "LimitSource",
    "OverrideCache",
    "Overrides",
    "StaticLimits",
    "changed_scopes",
    "read_auto_limits",
    "read_overrides",
]

log = logging.getLogger("fairpost.overrides")

REFRESH_SECONDS = 2.0
"""How often a replica re-reads the overrides: a change applies within about this long."""

GLOBAL_FIELD = "global"
_TENANT_FIELD = "t:"

Source = Literal["override", "settings", "tenant settings", "auto"]


@dataclass(frozen=True)
class Overrides:
    """What the operators set, as read from Redis."""

    global_limits: Limits | None = None
    tenants: Mapping[str, Limits] = field(default_factory=dict)
    paused: frozenset[str] = frozenset()
    warmup: Mapping[str, str] = field(default_factory=dict)
    """Warming tenant → its place as stored (only :class:`OverrideCache` fills it in)."""


@dataclass(frozen=True)
class EffectiveLimits:
    """The limits that apply to a scope now, and where they come from."""

    scope: str
    """``"global"`` or a tenant id."""
    windows: Limits | None
    """``None`` only for ``auto`` global limits no daemon has derived yet."""
    source: Source
    paused: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "limits": None if self.windows is None else format_limits(self.windows),
            "windows": [] if self.windows is None else [[w.seconds, w.limit] for w in self.windows],
            "source": self.source,
            "paused": self.paused,
        }


def read_overrides(raw: Mapping[Any, Any], paused: Iterable[Any]) -> Overrides:
    """Build :class:`Overrides` from the override hash and the paused set.

    A value that does not parse (written by hand with redis-cli) is logged and
    ignored: the settings apply instead.
    """
    global_limits: Limits | None = None
    tenants: dict[str, Limits] = {}
    for name, value in record(raw).items():
        try:
            windows = parse_limits(value)
        except ValueError as exc:
            log.warning("ignoring the unreadable quota override %s=%r: %s", name, value, exc)
            continue
        if name == GLOBAL_FIELD:
            global_limits = windows
        elif name.startswith(_TENANT_FIELD):
            tenants[name[len(_TENANT_FIELD) :]] = windows
    return Overrides(global_limits, tenants, frozenset(text(t) for t in paused))


def read_auto_limits(raw: Any) -> Limits | None:
    """The global limits a running daemon derived from SES (``MailKeys.auto_limits``), as
    read from Redis; None if there are none, or they do not parse."""
    if raw is None:
        return None
    try:
        return parse_limits(text(raw))
    except ValueError:
        return None


def resolve_global(settings: Settings, overrides: Overrides, auto: Limits | None) -> EffectiveLimits:
    if overrides.global_limits is not None:
        return EffectiveLimits(GLOBAL_FIELD, overrides.global_limits, "override")
    if isinstance(settings.global_limits, str):
        return EffectiveLimits(GLOBAL_FIELD, auto, "auto")
    return EffectiveLimits(GLOBAL_FIELD, settings.global_limits, "settings")


def resolve_tenant(settings: Settings, overrides: Overrides, tenant: str) -> EffectiveLimits:
    paused = tenant in overrides.paused
    override = overrides.tenants.get(tenant)
    if override is not None:
        return EffectiveLimits(tenant, override, "override", paused)
    own = settings.tenant(tenant).limits
    if own is not None:
        return EffectiveLimits(tenant, own, "tenant settings", paused)
    return EffectiveLimits(tenant, settings.tenant_limits, "settings", paused)


# -- what the sender reads ----------------------------------------------------------


class LimitSource(Protocol):
    """The limits the sender applies, read without I/O on every call."""

    def global_limits(self) -> Limits: ...

    def limits_for(self, tenant: str) -> Limits: ...

    def is_paused(self, tenant: str) -> bool: ...


class StaticLimits:
    """The settings alone, no live overrides (a sender built without an :class:`OverrideCache`)."""

    def __init__(self, settings: Settings) -> None:
        if isinstance(settings.global_limits, str):
            raise ConfigError(
                [("FAIRPOST_GLOBAL_LIMITS", "auto needs the daemon's SES account refresh (OverrideCache)")]
            )
        self._global: Limits = settings.global_limits
        self._settings = settings

    def global_limits(self) -> Limits:
        return self._global

    def limits_for(self, tenant: str) -> Limits:
        return self._settings.limits_for(tenant)

    def is_paused(self, tenant: str) -> bool:
        return False


class OverrideCache:
    """The settings, overridden live from Redis: what every sender replica applies.

    :meth:`run` re-reads the overrides every ``refresh_seconds``; the getters
    answer from memory. If Redis cannot be read, the last values stay in
    force. ``auto`` gives the global limits derived from SES when the settings
    say ``auto`` (see :mod:`fairpost.mailer.daemon.ses_account`).
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        *,
        auto: Callable[[], Limits] | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        on_change: Callable[[Overrides, Overrides], Awaitable[None]] | None = None,
        on_refresh: Callable[[], Awaitable[None]] | None = None,
        on_error: OnError | None = None,
    ) -> None:
        """``on_refresh``: run after each read of :meth:`run`, on its schedule (the
        sender's holds read what other replicas and operators changed of them);
        ``on_error``: told of each failed refresh of :meth:`run` (the daemon counts them)."""
        if isinstance(settings.global_limits, str) and auto is None:
            raise ConfigError([("FAIRPOST_GLOBAL_LIMITS", "auto needs the SES account limits source")])
        self._redis = client
        self._keys = keys
        self._settings = settings
        self._auto = auto
        self.refresh_seconds = refresh_seconds
        self._on_change = on_change
        self._on_refresh = on_refresh
        self._on_error = on_error
        self._overrides = Overrides()
        # A step due within two refreshes (and a second) is judged before it is due.
        self._warmups = Warmups(client, keys, settings, horizon_seconds=2 * refresh_seconds + 1)
        self.refreshed = 0
        """How many refreshes succeeded (tests wait on it)."""

    @property
    def overrides(self) -> Overrides:
        return self._overrides

    def global_limits(self) -> Limits:
        if self._overrides.global_limits is not None:
            return self._overrides.global_limits
        if isinstance(self._settings.global_limits, str):
            assert self._auto is not None
            return self._auto()
        return self._settings.global_limits

    def limits_for(self, tenant: str) -> Limits:
        """The tenant's own limits (an override, else the settings), with its warm-up step's."""
        return self._warmups.fold(tenant, self._own(tenant))

    def _own(self, tenant: str) -> Limits:
        return self._overrides.tenants.get(tenant) or self._settings.limits_for(tenant)

    def is_paused(self, tenant: str) -> bool:
        return tenant in self._overrides.paused

    @property
    def warmups(self) -> Warmups:
        return self._warmups

    def refusal_reason(self, tenant: str, window: Window | None) -> str | None:
        """``warmup`` or ``warmup_held`` when the window that refused the tenant's mail
        is its warm-up step's (a stricter limit than its own); else None."""
        return self._warmups.reason(tenant, window, self._own(tenant))

    async def refresh(self) -> Overrides:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.limit_overrides())
            pipe.smembers(self._keys.paused())
            pipe.time()
            self._warmups.read(pipe)
            asked = time.monotonic()
            raw, paused, server_time, places = await pipe.execute()
            local_ms = (asked + time.monotonic()) * 500  # the midpoint of the round trip
        met = await self._warmups.refresh(places, time_ms(server_time), local_ms)
        old = self._overrides
        new = dataclasses.replace(read_overrides(raw, paused), warmup=self._warmups.fingerprints())
        if met:
            # Met before they were known: their limits may have been too strict meanwhile.
            old = dataclasses.replace(old, warmup={**old.warmup, **dict.fromkeys(met, PENDING)})
        _log_changes(old, new)
        self._overrides = new
        self.refreshed += 1
        if new != old and self.refreshed > 1 and self._on_change is not None:
            try:
                await self._on_change(old, new)
            except Exception as exc:
                log.warning("could not act on the changed overrides at once: %s", exc)
        return new

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh until ``stop`` is set, every ``refresh_seconds`` or when the sender met
        a new tenant; a failed read keeps the last values, and is tried again on the
        outage back-off, at least once a period."""

        async def read() -> float:
            self._warmups.wake.clear()
            await self.refresh()
            if self._on_refresh is not None:
                await self._on_refresh()
            return self.refresh_seconds

        backoff = OutageBackoff(self._settings.max_outage_seconds, most=min(10.0, self.refresh_seconds))
        await forever(
            "overrides", read, stop, backoff=backoff, on_error=self._on_error, wake=[self._warmups.wake]
        )


def changed_scopes(old: Overrides, new: Overrides) -> tuple[bool, set[str]]:
    """Whether the global override changed, and which tenants' overrides or warm-up places
    changed, or were resumed."""
    tenants = {t for t in set(old.tenants) | set(new.tenants) if old.tenants.get(t) != new.tenants.get(t)}
    tenants |= {t for t in set(old.warmup) | set(new.warmup) if old.warmup.get(t) != new.warmup.get(t)}
    return old.global_limits != new.global_limits, tenants | (old.paused - new.paused)


def _log_changes(old: Overrides, new: Overrides) -> None:
    if old.global_limits != new.global_limits:
        log.info("global quota override: %s", _describe(new.global_limits))
    for tenant in sorted(set(old.tenants) | set(new.tenants)):
        if old.tenants.get(tenant) != new.tenants.get(tenant):
            log.info(
                "tenant quota override: %s", _describe(new.tenants.get(tenant)), extra={"tenant": tenant}
            )
    for tenant in sorted(new.paused - old.paused):
        log.info("tenant paused by an operator", extra={"tenant": tenant})
    for tenant in sorted(old.paused - new.paused):
        log.info("tenant resumed by an operator", extra={"tenant": tenant})


def _describe(windows: Limits | None) -> str:
    return "none (the settings apply)" if windows is None else format_limits(windows)
