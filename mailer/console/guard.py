"""Guessing the console's token, slowed: per client address, wrong tokens cost time.

After :data:`Guard.FREE` wrong tokens (a login form or a Bearer header) from one
address, that address must wait before its next token is even compared: half a
second, doubling with each further wrong one, at most :data:`Guard.MAX_DELAY`.
A token sent while the address waits is not compared at all (429 with
``Retry-After``): otherwise a guesser firing many requests at once would learn
the right one at full speed. The right token is never locked out: once the
announced wait has passed it works, however many wrong ones came before, and it
clears the address's count. An address quiet for :data:`Guard.FORGET_AFTER` is
forgotten; IPv6 clients count by their /64 (one host holds a whole /64).

Every wrong token is counted (``fairpost_console_auth_failures_total{via}``) and
logged with the client's address (never the token); every refusal to compare
too (``fairpost_console_auth_throttled_total``). The counts live in this console
process: behind a reverse proxy every client has the proxy's address, so one
guesser slows everyone's login there (for at most :data:`Guard.MAX_DELAY`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

__all__ = ["Guard"]

log = logging.getLogger("fairpost.console")


@dataclass
class _Failures:
    count: int
    last: float


class Guard:
    """The wrong tokens of each client address, and how long each must wait."""

    FREE = 10
    """Wrong tokens an address may send before it waits (a typo or two, a paste)."""
    FIRST_DELAY = 0.5
    MAX_DELAY = 30.0
    FORGET_AFTER = 15 * 60.0
    MAX_ADDRESSES = 10_000
    """Addresses remembered at most (the oldest forgotten first): memory stays bounded."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, registry: CollectorRegistry | None = None
    ) -> None:
        self._clock = clock
        self._seen: OrderedDict[str, _Failures] = OrderedDict()
        self.registry = registry or CollectorRegistry()
        self._failures = Counter(
            "fairpost_console_auth_failures",
            "Wrong console tokens, by how they came (login form, Bearer header).",
            ["via"],
            registry=self.registry,
        )
        self._throttled = Counter(
            "fairpost_console_auth_throttled",
            "Console tokens not compared: their address had sent too many wrong ones lately.",
            registry=self.registry,
        )
        for via in ("login", "bearer"):
            self._failures.labels(via)

    def wait(self, address: str | None) -> float:
        """Seconds this address must still wait before its next token is compared."""
        seen = self._current(_client(address))
        if seen is None or seen.count < self.FREE:
            return 0.0
        delay = min(self.MAX_DELAY, self.FIRST_DELAY * 2.0 ** min(seen.count - self.FREE, 16))
        return max(0.0, seen.last + delay - self._clock())

    def throttled(self, address: str | None) -> float:
        """:meth:`wait`, counting a refusal when it is not 0."""
        left = self.wait(address)
        if left > 0:
            self._throttled.inc()
        return left

    def failed(self, address: str | None, via: str = "login") -> None:
        """A wrong token from this address: counted, logged, and its wait grows."""
        client = _client(address)
        seen = self._current(client) or _Failures(0, 0.0)
        seen.count += 1
        seen.last = self._clock()
        self._seen[client] = seen
        self._seen.move_to_end(client)
        while len(self._seen) > self.MAX_ADDRESSES:
            self._seen.popitem(last=False)
        self._failures.labels(via).inc()
        how = (
            "a request with a wrong token in a Bearer header"
            if via == "bearer"
            else "a login with a wrong token"
        )
        log.warning("console: %s (from %s; %d lately from there)", how, address, seen.count)

    def succeeded(self, address: str | None) -> None:
        self._seen.pop(_client(address), None)

    def _current(self, client: str) -> _Failures | None:
        seen = self._seen.get(client)
        if seen is not None and self._clock() - seen.last > self.FORGET_AFTER:
            del self._seen[client]
            return None
        return seen


def _client(address: str | None) -> str:
    """What an address counts as: itself, or its /64 for IPv6."""
    try:
        ip = ipaddress.ip_address((address or "").split("%", 1)[0])
    except ValueError:
        return address or "unknown"
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
