"""Riding out an outage of Redis or AWS: back off, retry, and give up loudly.

A loop that fails (Redis or SQS does not answer) waits a little longer after
each failure in a row, and starts over after a success. An outage that lasts
longer than ``max_outage_seconds`` is not ridden out: the loop re-raises, so
the daemon stops loudly and its supervisor restarts it. Used by the
dispatcher's loop and by the loops of the workers downstream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import OutOfMemoryError, RedisError

from fairpost.dispatcher.access import refusal

log = logging.getLogger("fairpost.outage")

_T = TypeVar("_T")


class OutageBackoff:
    def __init__(self, max_outage_seconds: float, *, first: float = 0.5, most: float = 10.0) -> None:
        self.max_outage_seconds = max_outage_seconds
        self.first = first
        self.most = most
        self._errors = 0
        self._failing_since = 0.0

    def succeeded(self) -> None:
        self._errors = 0

    def failed(self, exc: BaseException | None = None) -> float | None:
        """One more failure in a row: the seconds to wait before trying again,
        or None once the outage has lasted too long (the caller re-raises). None
        at once for ``exc`` a refused credential or command: no outage but the
        configuration, which waiting cannot mend (fairpost.dispatcher.access).

        A full Redis (``exc`` an OOM refusal) is ridden out however long it lasts:
        a restart would not free it, and this daemon's finished jobs are what do
        (each frees its payload); an outage that follows is timed from its end."""
        if exc is not None and refusal(exc) is not None:
            return None
        self._errors += 1
        now = time.monotonic()
        if self._errors == 1 or isinstance(exc, OutOfMemoryError):
            self._failing_since = now
        if now - self._failing_since > self.max_outage_seconds:
            return None
        delay: float = min(self.first * 2 ** (self._errors - 1), self.most)
        return delay


async def until_landed(
    what: str,
    step: Callable[[], Awaitable[_T]],
    max_outage_seconds: float,
    *,
    first: float = 0.5,
    most: float = 10.0,
) -> _T:
    """Run ``step`` until Redis has it, riding out an outage: for writes that must
    land (a record of what was done already), so running one again must be safe.
    Raises the last RedisError once the outage outlasts ``max_outage_seconds``, or at
    once for a refused credential or command."""
    backoff = OutageBackoff(max_outage_seconds, first=first, most=most)
    while True:
        try:
            return await step()
        except RedisError as exc:
            delay = backoff.failed(exc)
            if delay is None:
                raise
            log.warning("%s failed (%s: %s); again in %.1fs", what, type(exc).__name__, exc, delay)
            await asyncio.sleep(delay)


async def done_before_stop(work: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Wait until ``work`` is done or ``stop`` is set, whichever is first; True if
    ``work`` is done. What becomes of work still running (cancelled, or left to land)
    is the caller's: a long poll cut off would lose what SQS hands it."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    return work.done()


async def wait_or_stop(stop: asyncio.Event, seconds: float, *wake: asyncio.Event) -> None:
    """Sleep ``seconds``, or less if ``stop`` (or any event of ``wake``) is set meanwhile."""
    waits = [asyncio.ensure_future(event.wait()) for event in (stop, *wake)]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
