"""Redis failures as fairpost errors: what failed, where, and whether it may have happened.

Any redis-py error (one server, Cluster or Sentinel: they all derive from
``redis.RedisError``) raised inside :meth:`RedisFailures.wrap` becomes a
:class:`fairpost.mailer.errors.RedisFailed` that names the operation, the Redis URL
with its password masked, the timeout, and whether the write may have been
done all the same, so that the caller knows whether retrying is safe.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Concatenate, ParamSpec, Protocol, TypeVar
from urllib.parse import urlsplit

import redis.exceptions

from fairpost.config import Settings, mask_url
from fairpost.dispatcher.errors import NotReplicated
from fairpost.mailer.errors import RedisFailed

WRITES = frozenset({"enqueue", "cancel"})
"""Operations that change something in Redis."""


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
            raise self.failed(operation, exc) from exc

    def failed(
        self, operation: str, exc: redis.exceptions.RedisError, *, writes: bool | None = None
    ) -> RedisFailed:
        """``writes``: whether the operation changes something (default: it is in WRITES)."""
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
        # A refused command (an error answer, out of memory) did nothing: fairpost's
        # writes are single scripts, refused whole. An answer that never came may
        # hide a write that was done.
        refused = isinstance(exc, redis.exceptions.ResponseError) and not isinstance(exc, NotReplicated)
        if writes is None:
            writes = operation in WRITES
        maybe = writes and not never_sent and not refused
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
            f"{operation} failed: {what} ({detail}); {outcome}",
            url=self.url,
            may_have_written=maybe,
        )


class _HasSettings(Protocol):
    settings: Settings


_Owner = TypeVar("_Owner", bound=_HasSettings)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def redis_operation(
    operation: str, *, writes: bool = False
) -> Callable[[Callable[Concatenate[_Owner, _P], _R]], Callable[Concatenate[_Owner, _P], _R]]:
    """A blocking admin client's method (dead letters, suppressions, quotas) fails as
    :class:`RedisFailed` naming ``operation``, like the mail client's calls."""

    def decorate(method: Callable[Concatenate[_Owner, _P], _R]) -> Callable[Concatenate[_Owner, _P], _R]:
        @functools.wraps(method)
        def wrapped(self: _Owner, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return method(self, *args, **kwargs)
            except redis.exceptions.RedisError as exc:
                raise RedisFailures(self.settings).failed(operation, exc, writes=writes) from exc

        return wrapped

    return decorate


def _never_sent(exc: redis.exceptions.RedisError) -> bool:
    """The command never reached Redis: no connection was made."""
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        text = str(exc).lower()
        return "connecting" in text or "no master found" in text or "connection refused" in text
    return False
