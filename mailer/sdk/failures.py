"""Redis failures as fairpost errors: what failed, where, and whether it may have happened.

Any redis-py error (one server, Cluster or Sentinel: they all derive from
``redis.RedisError``) raised inside :meth:`RedisFailures.wrap` becomes a
:class:`fairpost.mailer.errors.RedisFailed` that names the operation, the Redis URL
with its password masked, the timeout, and whether the write may have been
done all the same, so that the caller knows whether retrying is safe.

The mail client's calls, and the admin clients' (:func:`redis_operation`), go
through :meth:`RedisFailures.call` (or ``acall``) instead: while Redis is away (a
restart, a failover, replicas that do not confirm a write in time) they are
tried again, backing off, for up to ``FAIRPOST_REDIS_RETRY_SECONDS``, and only
then fail. The mail client's calls are safe to repeat: an enqueue's job ids are
made before the first try, so a try that reached Redis but lost its answer is
recognised by the next one (enqueue.lua answers "this id exists" and writes
nothing, and its ``WAIT`` waits for the replicas again); a cancel is idempotent;
the rest only read. An admin write that a second run would repeat (a new webhook
endpoint, another secret, events or dead letters queued again) is tried again
only while no try may have reached Redis (``repeatable=False``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Concatenate, ParamSpec, Protocol, TypeVar
from urllib.parse import urlsplit

import redis.exceptions

from fairpost.config import Settings, mask_url
from fairpost.dispatcher.access import access_denied
from fairpost.dispatcher.errors import NotReplicated
from fairpost.mailer.errors import RedisFailed

log = logging.getLogger("fairpost.sdk")

WRITES = frozenset({"enqueue", "cancel"})
"""Operations that change something in Redis."""

AWAY = (
    redis.exceptions.ConnectionError,  # refused, cut, LOADING, no master found (Sentinel)
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,  # a demoted master
    redis.exceptions.ClusterError,  # CLUSTERDOWN, MASTERDOWN, a topology that would not settle
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # and MOVED: the slot is changing hands
    NotReplicated,  # replicas behind, restarting or failing over (FAIRPOST_REDIS_MIN_REPLICAS)
)
"""Errors that say Redis is away or moving, not that the call is wrong: worth trying
again. Anything else (out of memory, a bug) is not."""

_FIRST_DELAY = 0.05
_MOST_DELAY = 1.0

_P = ParamSpec("_P")
_R = TypeVar("_R")


class RedisFailures:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = mask_url(settings.redis_url)
        self._password = urlsplit(settings.redis_url).password

    @contextmanager
    def wrap(self, operation: str) -> Iterator[None]:
        """Raise a redis-py error inside the block as :class:`RedisFailed`."""
        try:
            yield
        except redis.exceptions.RedisError as exc:
            raise self._refused(exc) or self.failed(operation, exc) from exc

    def call(
        self,
        operation: str,
        attempt: Callable[[], _R],
        *,
        writes: bool | None = None,
        repeatable: bool = True,
    ) -> _R:
        """``attempt()``, tried again while Redis is away; then :class:`RedisFailed`.
        ``attempt`` must be safe to repeat (the module's docstring says why ours are),
        or ``repeatable=False``: then it is tried again only while no try may have
        reached Redis. ``writes``: as for :meth:`failed`."""
        tries = _Tries(self.settings.redis_retry_seconds, repeatable)
        while True:
            try:
                return attempt()
            except redis.exceptions.RedisError as exc:
                delay = self._again(operation, exc, tries, writes)
            time.sleep(delay)

    async def acall(self, operation: str, attempt: Callable[[], Awaitable[_R]]) -> _R:
        """:meth:`call` for asyncio."""
        tries = _Tries(self.settings.redis_retry_seconds, repeatable=True)
        while True:
            try:
                return await attempt()
            except redis.exceptions.RedisError as exc:
                delay = self._again(operation, exc, tries, None)
            await asyncio.sleep(delay)

    def _again(
        self, operation: str, exc: redis.exceptions.RedisError, tries: _Tries, writes: bool | None
    ) -> float:
        """The seconds to wait before the next try; raises :class:`RedisFailed` if there is none,
        and a refused credential or command at once (fairpost.dispatcher.access)."""
        denied = self._refused(exc)
        if denied is not None:
            raise denied from exc
        tries.failed(self._maybe_written(operation, exc, writes))
        delay = tries.next_delay(exc)
        if delay is None:
            raise self.failed(operation, exc, writes=writes, tries=tries) from exc
        log.info(
            "Redis is away for %s (%s); retrying in %.2f s, for up to %g s in all",
            operation,
            type(exc).__name__,
            delay,
            self.settings.redis_retry_seconds,
        )
        return delay

    def _refused(self, exc: redis.exceptions.RedisError) -> Exception | None:
        return access_denied(exc, self.settings)

    def failed(
        self,
        operation: str,
        exc: redis.exceptions.RedisError,
        *,
        writes: bool | None = None,
        tries: _Tries | None = None,
    ) -> RedisFailed:
        """``writes``: whether the operation changes something (default: it is in WRITES);
        ``tries``: the earlier tries of the same call (any of them may have written)."""
        detail = f"{type(exc).__name__}: {exc}"
        if self._password:
            detail = detail.replace(self._password, "***")
        s = self.settings
        never_sent = _never_sent(exc)
        if never_sent:
            what = f"could not connect to Redis at {self.url} within {s.redis_connect_timeout:g} s"
        elif isinstance(exc, redis.exceptions.TimeoutError):
            what = f"Redis at {self.url} did not answer within {s.redis_timeout:g} s"
        elif isinstance(exc, redis.exceptions.ConnectionError):
            what = f"the connection to Redis at {self.url} broke (timeout {s.redis_timeout:g} s)"
        elif isinstance(exc, NotReplicated):
            what = f"the write reached Redis at {self.url} but not enough of its replicas"
        else:
            what = f"Redis at {self.url} refused it"
        if writes is None:
            writes = operation in WRITES
        maybe = self._maybe_written(operation, exc, writes) if tries is None else tries.maybe_written
        tried = ""
        if tries is not None and tries.count > 1:
            tried = (
                f", tried {tries.count} times in {s.redis_retry_seconds:g} s (FAIRPOST_REDIS_RETRY_SECONDS)"
            )
        if maybe and operation == "enqueue":
            outcome = (
                "the mail may have been written: retry with the same idempotency key, "
                "which cannot duplicate it"
            )
        elif maybe:
            outcome = "it may have been done all the same: check before retrying"
        elif writes:
            outcome = "nothing was written: retrying is safe"
        else:
            outcome = "nothing was changed"
        return RedisFailed(
            operation,
            f"{operation} failed: {what} ({detail}){tried}; {outcome}",
            url=self.url,
            may_have_written=maybe,
        )

    @staticmethod
    def _maybe_written(operation: str, exc: redis.exceptions.RedisError, writes: bool | None) -> bool:
        """Whether Redis may have done the write all the same. A refused command (an
        error answer, out of memory) did nothing: fairpost's writes are single scripts,
        refused whole. An answer that never came may hide a write that was done."""
        refused = isinstance(exc, redis.exceptions.ResponseError) and not isinstance(exc, NotReplicated)
        if writes is None:
            writes = operation in WRITES
        return writes and not _never_sent(exc) and not refused


class _Tries:
    """The tries of one call: how many, whether any may have written, and the
    back-off to the next one (doubling, with jitter, so that applications cut off
    by the same failover do not all come back at once), within ``seconds``; a call
    that is not ``repeatable`` has none once a try may have written."""

    def __init__(self, seconds: float, repeatable: bool) -> None:
        self.deadline = time.monotonic() + seconds
        self.repeatable = repeatable
        self.count = 0
        self.maybe_written = False

    def failed(self, maybe_written: bool) -> None:
        self.count += 1
        self.maybe_written = self.maybe_written or maybe_written

    def next_delay(self, exc: redis.exceptions.RedisError) -> float | None:
        left = self.deadline - time.monotonic()
        if not isinstance(exc, AWAY) or left <= 0 or (self.maybe_written and not self.repeatable):
            return None
        delay: float = min(_FIRST_DELAY * 2.0 ** (self.count - 1), _MOST_DELAY)
        return min(left, delay * random.uniform(0.5, 1.0))


class _HasSettings(Protocol):
    settings: Settings


_Owner = TypeVar("_Owner", bound=_HasSettings)


def redis_operation(
    operation: str, *, writes: bool = False, repeatable: bool = True
) -> Callable[[Callable[Concatenate[_Owner, _P], _R]], Callable[Concatenate[_Owner, _P], _R]]:
    """A blocking admin client's method (dead letters, suppressions, quotas, webhooks)
    is tried again while Redis is away and fails as :class:`RedisFailed` naming
    ``operation``, like the mail client's calls (:meth:`RedisFailures.call`).

    ``repeatable``: a second run leaves Redis as one run would (a read, a set, a
    pause; an answer such as "it was already" may then speak of the first run's
    work). A method that is not (it adds, rotates or queues again) is tried again
    only while no try may have reached Redis."""

    def decorate(method: Callable[Concatenate[_Owner, _P], _R]) -> Callable[Concatenate[_Owner, _P], _R]:
        @functools.wraps(method)
        def wrapped(self: _Owner, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            failures = RedisFailures(self.settings)
            run = functools.partial(method, self, *args, **kwargs)
            return failures.call(operation, run, writes=writes, repeatable=repeatable)

        return wrapped

    return decorate


def _never_sent(exc: redis.exceptions.RedisError) -> bool:
    """The command never reached Redis: no connection was made."""
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        text = str(exc).lower()
        return "connecting" in text or "no master found" in text or "connection refused" in text
    return False
