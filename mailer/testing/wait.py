"""Waiting for a condition with a deadline: the one polling loop of the demo, the tests and the benchmarks.

Never sleep and hope: poll the condition, and fail naming what was awaited once
the deadline has passed. The condition is always checked once after the
deadline passes, so a machine that was busy for the whole wait still gets its
last look before the verdict.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from fairpost.mailer.errors import TimedOut

__all__ = ["TimedOut", "wait_for", "wait_for_async"]


class _Deadline:
    def __init__(self, within: float, what: str) -> None:
        self.within = within
        self.what = what
        self._at = time.monotonic() + within

    def check(self) -> None:
        """Raise :class:`TimedOut` if the deadline has passed."""
        if time.monotonic() > self._at:
            raise TimedOut(f"timed out after {self.within}s waiting for {self.what}")


def wait_for(predicate: Callable[[], object], *, within: float, what: str, interval: float = 0.02) -> None:
    """Call ``predicate`` until it returns something truthy; :class:`TimedOut` after ``within`` seconds."""
    deadline = _Deadline(within, what)
    while not predicate():
        deadline.check()
        time.sleep(interval)


async def wait_for_async(
    predicate: Callable[[], object | Awaitable[object]], *, within: float, what: str, interval: float = 0.05
) -> None:
    """:func:`wait_for` for the event loop: ``predicate`` may be a plain or an async function."""
    deadline = _Deadline(within, what)
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        deadline.check()
        await asyncio.sleep(interval)
