"""Sliding-window quotas in Redis, global and per tenant, counted in recipients.

Each window (``Window(seconds, limit)``) of each scope is one Redis hash of
time buckets (:meth:`fairpost.mailer.sdk.keys.MailKeys.quota`), so a day window of 50,000
costs about ``buckets_per_window`` fields, never one entry per mail. All the
work that must be atomic is Lua beside this module, a script an operation
(``acquire.lua``, ``peek.lua``, ``refund.lua``, ``restamp.lua``, ``usage.lua``),
each after the library they share (``windows.lua``, :func:`quota_script`):
an acquire checks and takes every global and tenant window in one round trip,
with the Redis server's clock, so any number of replicas share one count.

Bucket slack: the count at time ``t`` includes every bucket that overlaps the
window ``(t - W, t]`` in full. Nothing granted inside the window is ever
missed (never over the limit), but units up to one bucket width
(``W / buckets_per_window``, 20 ms for a second, under 29 min for a day) older than
the window may still count, so a refusal can come up to one bucket early.

``retry_after`` is exact to the millisecond for the engine's own count: the
refused mail fits at ``at_ms + retry_after`` and not 1 ms before, if nothing
else is granted meanwhile. Against an exact sliding window it is late by at
most one bucket width minus 1 ms, never early.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from fairpost.config.limits import BUDGET_SECONDS, Window
from fairpost.dispatcher.durable import Durability
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.sdk.keys import MailKeys

__all__ = [
    "BUCKETS_PER_WINDOW",
    "NEVER",
    "RATE_WINDOW_SECONDS",
    "Grant",
    "QuotaEngine",
    "StreamWindows",
    "never_fits_reason",
    "quota_script",
]


BUCKETS_PER_WINDOW = 50
"""Buckets per window unless told otherwise; every replica must use the same."""

NEVER = -1.0
"""``Grant.retry_after`` for a mail whose cost exceeds a budget window's limit: it can never fit."""

RATE_WINDOW_SECONDS = BUDGET_SECONDS
"""Windows shorter than this are rates: a mail over the limit goes alone once the
window is empty. Longer windows are budgets: a mail over the limit never fits
(``fairpost.config.limits.Window.is_budget``, which the SDK checks too; windows.lua's RATE_MS)."""

SHARE_PARTS = ("tag", "until", "weight", "refused")
"""The fair share's keys (``MailKeys.quota_share``), in the order acquire.lua takes them."""

_OPERATIONS = ("acquire", "peek", "refund", "restamp", "usage")
"""The quota's scripts, one an operation (``acquire_fair`` is acquire.lua's)."""

_MOST_UNANSWERED = 1024
"""Asks whose answer was lost a process remembers (one per tenant at most, but
for their costs); an ask forgotten counts again when asked again: the safe side."""


@dataclass(frozen=True)
class StreamWindows:
    """The windows of a tenant's stream, counted apart from (and as well as) the tenant's."""

    scope: str
    """The stream's scope: its FIFO group id (``<tenant>:notification``)."""
    windows: tuple[Window, ...]

    def __bool__(self) -> bool:
        return bool(self.windows)


_Ask = tuple[str, str, tuple[int, ...], tuple[Window, ...], tuple[Window, ...], tuple[Window, ...]]
"""What an acquire asks: the tenant, the operation, the costs and the windows."""

_BLOCKED: dict[int, Literal["global", "tenant", "share"] | None] = {
    0: None,
    1: "global",
    2: "tenant",
    3: "share",
}


@dataclass(frozen=True)
class Grant:
    """What :meth:`QuotaEngine.acquire` granted of a batch of mails.

    ``granted``: how many of the mails, from the first, were granted.
    ``retry_after``: seconds (whole milliseconds) until mail number ``granted``,
    the first refused, would fit in every window, given what is counted now;
    ``0.0`` if all were granted; :data:`NEVER` (``-1.0``) if its cost exceeds
    a window's limit, so that it can never be sent (dead-letter it).
    ``blocked_by``: ``"global"``, ``"tenant"`` or ``"share"`` (ahead of its
    weighted share of a global quota others wait for), the scope that refused the
    first refused mail (the one that frees later if both do; ``"global"`` on
    a tie); ``None`` if all were granted.
    ``at_ms``: the Redis server time (ms) the grant was taken at; pass it back
    to :meth:`QuotaEngine.refund`.
    ``too_big_for``: with :data:`NEVER`, the budget window (a minute or longer)
    the first refused mail can never fit; see :func:`never_fits_reason`.
    ``binding``: the window that refused the first refused mail (the one that
    frees latest, or the one it can never fit); ``None`` if all were granted
    or the share refused it. Diagnostic (why a mail waits): not compared.
    """

    granted: int
    retry_after: float
    blocked_by: str | None
    at_ms: int
    too_big_for: Window | None = None
    binding: Window | None = field(default=None, compare=False)
    asked_mono: float | None = field(default=None, compare=False)
    """This process's monotonic clock before it asked: no later than ``at_ms``, in
    server time (an answer lost and asked for again: before the first ask)."""


def quota_script(operation: str) -> str:
    """The text of the quota's script ``<operation>.lua``, after ``windows.lua``, the
    arguments, bucket math and decision every operation shares (as ring.lua opens the
    dispatcher's scripts, fairpost.dispatcher.calls.script)."""
    package = "fairpost.mailer.quota"
    return lua_source(package, "windows") + "\n" + lua_source(package, operation)


def never_fits_reason(grant: Grant, recipients: int) -> str:
    """The dead-letter reason for a mail refused with :data:`NEVER`, naming the window."""
    scope = "global" if grant.blocked_by == "global" else "tenant"
    window = grant.too_big_for
    named = f"the {scope} limit {window}" if window is not None else f"a {scope} quota window"
    return f"the mail has {recipients} recipients, more than {named} can ever allow"


class QuotaEngine:
    """Atomic sliding-window quotas over ``redis.asyncio.Redis``.

    Every replica must use the same ``buckets_per_window``: it decides which
    bucket a unit is counted in. Keys expire once their newest bucket has left
    the window, so idle tenants cost nothing.

    ``now_ms`` on the methods is a test hook: when given, the script uses it
    instead of the server's ``TIME``, so tests drive time. Key expiry is
    still real time (relative to the ``now_ms`` given), and a test that moves
    time backwards gets counts on the safe (too high) side.
    """

    def __init__(
        self,
        redis: Redis,
        keys: MailKeys,
        *,
        buckets_per_window: int = BUCKETS_PER_WINDOW,
        durability: Durability | None = None,
    ) -> None:
        if buckets_per_window < 1:
            raise ValueError(f"buckets_per_window must be at least 1, not {buckets_per_window}")
        self._keys = keys
        self._buckets = buckets_per_window
        self._redis = redis
        # A grant a mail is sent under must outlive a failover (FAIRPOST_REDIS_MIN_REPLICAS):
        # a lost grant leaves its units out of the windows, room for more than the limit.
        self._durability = durability or Durability()
        self._scripts = {op: redis.register_script(quota_script(op)) for op in _OPERATIONS}
        # The token of each ask whose answer never came (by what it asked): the same
        # ask again, from this process, gets the grant Redis may have counted for it.
        self._unanswered: OrderedDict[_Ask, tuple[str, float]] = OrderedDict()

    @property
    def buckets_per_window(self) -> int:
        """How many buckets each window is cut into."""
        return self._buckets

    async def acquire(
        self,
        tenant: str,
        costs: Sequence[int],
        global_windows: Sequence[Window],
        tenant_windows: Sequence[Window],
        *,
        weight: int | None = None,
        now_ms: int | None = None,
        stream: StreamWindows | None = None,
    ) -> Grant:
        """Grant the longest prefix of ``costs`` that fits in every window, atomically.

        ``costs`` are the recipient counts of mails in send order. Granting
        stops at the first mail that does not fit: later, smaller mails are
        not granted, so the order of a tenant's mail is kept. The granted
        units are counted at once in every global and tenant window.
        With a ``weight``, tenants contending for the global quota share it in
        proportion to their weights (see acquire.lua): while another tenant is
        refused for global room, a tenant ahead of its share is refused with
        ``blocked_by == "share"`` until that tenant is due back (at most the
        shortest global window). The cost does not grow with the number of
        tenants contending (O(log n)).
        A mail bigger than a window shorter than a minute (a rate) waits until
        that window is empty and goes alone; bigger than a longer window (a
        budget), it is refused with :data:`NEVER` and ``too_big_for``.
        ``now_ms`` is a test hook (see the class); leave it out in production.
        ``stream``: the windows of the mails' stream (a tenant's notification mail may
        have a limit of its own, fairpost.mailer.quota.stream_limits), checked and
        counted with the tenant's own, in the same call.

        An acquire that raised (Redis may have counted it and lost only the
        answer) is remembered by what it asked: the same ask again from this
        engine (the tenant, costs and windows) gets the grant counted for it, if
        any, instead of counting the units twice (acquire.lua keeps each grant's
        answer under the acquire's token for five minutes). Asked by another
        replica, or with other costs, the lost grant's units stay counted until
        they leave the window: the safe side.
        """
        op, tail = _acquire_op(tenant, costs, weight, bool(global_windows))
        extra = stream.windows if stream else ()
        ask: _Ask = (tenant, op, tuple(costs), tuple(global_windows), tuple(tenant_windows), tuple(extra))
        # Only one call may take a lost answer's grant: two sent under one count
        # would go over the limit.
        token, asked = self._unanswered.pop(ask, (uuid.uuid4().hex, time.monotonic()))
        try:
            reply = await self._run(
                op, tenant, global_windows, tenant_windows, now_ms, tail, record=token, stream=stream
            )
        except RedisError:
            # Redis may have counted it, and only the answer was lost.
            self._unanswered[ask] = (token, asked)
            while len(self._unanswered) > _MOST_UNANSWERED:
                self._unanswered.popitem(last=False)
            raise
        return _grant(reply, (*global_windows, *tenant_windows, *extra), asked)

    async def refund(
        self,
        tenant: str,
        cost: int,
        at_ms: int,
        global_windows: Sequence[Window],
        tenant_windows: Sequence[Window],
        *,
        stream: StreamWindows | None = None,
    ) -> None:
        """Give back ``cost`` units of a grant taken at ``at_ms`` for a mail never sent.

        The units leave the buckets they were counted in (never below zero);
        buckets that already left their window are left alone, as the units
        no longer count anyway. Refund each mail once.
        """
        if cost < 1:
            raise ValueError(f"a refund is at least 1 recipient, not {cost}")
        await self._run("refund", tenant, global_windows, tenant_windows, at_ms, [cost], stream=stream)

    async def restamp(
        self,
        tenant: str,
        cost: int,
        at_ms: int,
        global_windows: Sequence[Window],
        tenant_windows: Sequence[Window],
        *,
        pipeline: Pipeline | None = None,
        stream: StreamWindows | None = None,
    ) -> int | None:
        """Count a sent mail's units from when SES answered instead of from the grant.

        SES counts a mail on arrival, somewhere between the grant and the
        answer; from the grant until a window after the answer covers it. The
        sender also moves the units of a call still under way, so that they
        keep counting however long it takes. Returns the server time (ms) the
        units now count from (``None`` with a pipeline).
        The units of several mails granted together (one ``at_ms``) may be
        moved in one call, with their summed cost. With ``pipeline`` the call
        is only queued on it: it runs at the caller's ``execute()`` (a later
        answer time is on the safe side: it counts the units longer).
        """
        if cost < 1:
            raise ValueError(f"a restamp is at least 1 recipient, not {cost}")
        reply = await self._run(
            "restamp", tenant, global_windows, tenant_windows, at_ms, [cost], pipeline=pipeline, stream=stream
        )
        return None if pipeline is not None else reply[0]

    def in_one_bucket(self, from_ms: int, to_ms: int, windows: Iterable[Window]) -> bool:
        """Whether ``from_ms`` and ``to_ms`` (server time) fall in one bucket of every
        window: units counted at the first then count as long as a restamp to the
        second would make them (restamp.lua would move nothing)."""
        for window in windows:
            width = max(1, window.seconds * 1000 // self._buckets)
            if from_ms // width != to_ms // width:
                return False
        return True

    async def usage(
        self,
        scope_tenant: str | None,
        windows: Sequence[Window],
        *,
        now_ms: int | None = None,
    ) -> list[tuple[Window, int]]:
        """Units counted now in each window of a tenant, or the global scope for ``None``."""
        if scope_tenant is None:
            reply = await self._run("usage", "", windows, (), now_ms, ())
        else:
            reply = await self._run("usage", scope_tenant, (), windows, now_ms, ())
        return list(zip(windows, reply[1:], strict=True))

    async def global_retry_after(
        self, global_windows: Sequence[Window], *, now_ms: int | None = None
    ) -> float:
        """Seconds until one unit fits in every global window; 0.0 if it fits now.

        Takes nothing: the sender uses it to know how long to stop receiving.
        """
        reply = await self._run("peek", "", global_windows, (), now_ms, [1, 1])
        return max(0, reply[1]) / 1000

    async def retry_after(
        self, tenant: str, tenant_windows: Sequence[Window], *, cost: int = 1, now_ms: int | None = None
    ) -> float:
        """Seconds until ``cost`` units fit in every window of ``tenant``; 0.0 if they fit now;
        :data:`NEVER` if they never can. Takes nothing (for stats)."""
        reply = await self._run("peek", tenant, (), tenant_windows, now_ms, [1, cost])
        return NEVER if reply[1] < 0 else reply[1] / 1000

    async def _run(
        self,
        op: str,
        tenant: str,
        global_windows: Sequence[Window],
        tenant_windows: Sequence[Window],
        time_ms: int | None,
        tail: Sequence[int | str],
        *,
        pipeline: Pipeline | None = None,
        record: str | None = None,
        stream: StreamWindows | None = None,
    ) -> list[int]:
        """``record``: an acquire's token (acquire.lua keeps its answer under it);
        ``stream``: more windows, of their own scope, counted after the tenant's."""
        keys: list[str] = []
        args: list[str | int] = [op, "" if time_ms is None else time_ms, self._buckets, len(global_windows)]
        scopes = [("global", global_windows), (f"t:{tenant}", tenant_windows)]
        if stream:
            scopes.append((f"t:{stream.scope}", stream.windows))
        for scope, windows in scopes:
            if len({w.seconds for w in windows}) != len(windows):
                raise ValueError(f"two {scope} windows of the same length: {list(windows)}")
            for window in windows:
                keys.append(self._keys.quota(scope, window.seconds))
                args += [window.seconds, window.limit]
        if op == "acquire_fair":
            keys += [self._keys.quota_share(part) for part in SHARE_PARTS]
        if record is not None:
            keys.append(self._keys.quota_grant(record))
        args += tail
        script = self._scripts[op.removesuffix("_fair")]
        if pipeline is not None:
            # Queued only; the reply comes from the caller's pipeline.execute().
            await script(keys=keys, args=args, client=pipeline)
            return []
        if op.startswith("acquire") and self._durability.replicas:
            async with self._redis.pipeline(transaction=False) as pipe:
                await script(keys=keys, args=args, client=pipe)
                self._durability.queue_wait(pipe)
                [reply] = self._durability.check(await pipe.execute())
        else:
            reply = await script(keys=keys, args=args)
        return [int(value) for value in reply]


def _acquire_op(
    tenant: str, costs: Sequence[int], weight: int | None, global_windows: bool
) -> tuple[str, list[int | str]]:
    """The script's operation and its arguments after the windows: a weighted ask
    shares the global quota (``acquire_fair``)."""
    for cost in costs:
        if cost < 1:
            raise ValueError(f"a mail costs at least 1 recipient, not {cost}")
    if weight is None or not global_windows:
        return "acquire", list[int | str](_mails(costs))
    if weight < 1:
        raise ValueError(f"a weight is at least 1, not {weight}")
    return "acquire_fair", [tenant, weight, *_mails(costs)]


def _mails(costs: Sequence[int]) -> list[int]:
    """The mails as windows.lua takes them: their number, then their costs, a run
    of equal costs at the end given once (each argument is a string Lua makes)."""
    given = len(costs)
    while given > 1 and costs[given - 1] == costs[given - 2]:
        given -= 1
    return [len(costs), *costs[:given]]


def _grant(reply: list[int], windows: Sequence[Window], asked: float) -> Grant:
    """acquire.lua's answer; ``windows`` in the order the script got them."""
    granted, retry_ms, blocked, at_ms, never, binding = reply
    return Grant(
        granted=granted,
        retry_after=NEVER if retry_ms < 0 else retry_ms / 1000,
        blocked_by=_BLOCKED[blocked],
        at_ms=at_ms,
        too_big_for=windows[never - 1] if never else None,
        binding=windows[binding - 1] if binding else None,
        asked_mono=asked,
    )
