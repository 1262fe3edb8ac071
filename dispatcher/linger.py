"""How long a claim that did not fill its batch waits for company.

A batch is one call downstream, full or not. A fixed wait gathers whatever comes
in it: at 150 jobs a second, 50 ms hands off 8 or 9 at a time. When the rate
jobs were claimed at lately says the rest of the batch comes within twice the
linger, the claim waits for it (a few ms more, one call fewer in ten); when it
would not (a trickle, or one tenant held back by its quota), longer only adds
latency, and the claim waits the configured linger.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

_HORIZON = 1.0
"""Seconds of claims the rate is taken over."""
_SLACK = 1.25
"""Arrivals are bursty: the wait for n jobs is the time n would take at the mean
rate, and a quarter more, so that most such batches fill."""


class Linger:
    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.base = seconds
        self._clock = clock
        self._claims: deque[tuple[float, int]] = deque()
        self._recent = 0

    def claimed(self, count: int) -> None:
        """Record a claim's jobs (an empty claim too: it moves the horizon on)."""
        now = self._clock()
        if count:
            self._claims.append((now, count))
            self._recent += count
        while self._claims and self._claims[0][0] <= now - _HORIZON:
            self._recent -= self._claims.popleft()[1]

    def seconds(self, missing: int) -> float:
        """How long to wait for ``missing`` more jobs."""
        if not self._recent:
            return self.base
        # No linger configured, or nothing missing: fill is never above base.
        fill = _SLACK * missing * _HORIZON / self._recent
        return fill if self.base < fill <= 2 * self.base else self.base
