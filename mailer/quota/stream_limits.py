"""A stream's own limits (issue #42): a tenant's notification mail may be held to
less than the tenant's quota (say half its rate), so a digest run leaves room for
its transactional mail. Its mail counts in the tenant's windows as well: the
tenant's quota stays one.

The scope is the stream's FIFO group id, ``<tenant>:notification``
(fairpost.mailer.sdk.streams.group_id). Its limits come from a live override
(``fairpost quota set acme:notification "2/second"``: the override hash's field
``t:acme:notification``, read with the others by every replica), else the
tenant's ``notification_limits`` setting, else ``FAIRPOST_NOTIFICATION_LIMITS``;
with none, the tenant's limits alone apply.
"""

from __future__ import annotations

from fairpost.config import Settings
from fairpost.mailer.quota.engine import StreamWindows
from fairpost.mailer.quota.overrides import EffectiveLimits, LimitSource, OverrideCache, Overrides
from fairpost.mailer.sdk.streams import TRANSACTIONAL, group_id, split_group

__all__ = ["resolve_stream", "stream_windows"]


def stream_windows(limits: LimitSource, settings: Settings, tenant: str, stream: str) -> StreamWindows | None:
    """The windows the sender checks a group of ``stream`` against besides the tenant's; None: none."""
    if stream == TRANSACTIONAL:
        return None
    scope = group_id(tenant, stream)
    live = limits.overrides.tenants.get(scope) if isinstance(limits, OverrideCache) else None
    windows = live or settings.notification_limits_for(tenant)
    return StreamWindows(scope, windows) if windows else None


def resolve_stream(settings: Settings, overrides: Overrides, scope: str) -> EffectiveLimits | None:
    """What ``fairpost quota show <tenant>:notification`` shows; None if ``scope`` is no stream's."""
    split = split_group(scope)
    if split is None:
        return None
    tenant, _ = split
    override = overrides.tenants.get(scope)
    if override is not None:
        return EffectiveLimits(scope, override, "override")
    own = settings.tenant(tenant).notification_limits
    if own is not None:
        return EffectiveLimits(scope, own, "tenant settings")
    return EffectiveLimits(scope, settings.notification_limits, "settings")
