"""Redis failures as fairpost errors: what failed, where, and whether it may have happened.

Any redis-py error (one server, Cluster or Sentinel: they all derive from
``redis.RedisError``) raised inside :meth:`RedisFailures.wrap` becomes a
:class:`mailer.errors.RedisFailed` that names the operation, the Redis URL
with its password masked, the timeout, and whether the write may have been
done all the same, so that the caller knows whether retrying is safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import redis.exceptions

from config import Settings, mask_url
from dispatcher.errors import NotReplicated
from mailer.errors import RedisFailed

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

    def failed(self, operation: str, exc: redis.exceptions.RedisError) -> RedisFailed:
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
        maybe = operation in WRITES and not never_sent and not refused
        if maybe and operation == "enqueue":
            outcome = (
                "the mail may have been written: retry with the same idempotency key, "
                "which cannot duplicate it"
            )
        elif maybe:
            outcome = f"the {operation} may have been done: check before retrying"
        elif operation in WRITES:
            outcome = "nothing was written: retrying is safe"
        else:
            outcome = "nothing was changed"
        return RedisFailed(
            operation,
            f"{operation} failed: {what} ({detail}); {outcome}",
            url=self.url,
            may_have_written=maybe,
        )


def _never_sent(exc: redis.exceptions.RedisError) -> bool:
    """The command never reached Redis: no connection was made."""
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        text = str(exc).lower()
        return "connecting" in text or "no master found" in text or "connection refused" in text
    return False
