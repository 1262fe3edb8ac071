"""A TCP proxy on loopback in front of a ``redis-server`` that cuts every connection, again and again.

What a client sees when the network to Redis drops, a master dies or a proxy in
between restarts: every open connection is reset at once (a command on its way
is lost with it, and so is an answer on its way back, after Redis ran the
command), and for a moment a new connection is reset as soon as it is made.
:meth:`RedisCutter.cut` does that once; :meth:`RedisCutter.cut_repeatedly`
a bounded number of times. Every cut is kept in :attr:`RedisCutter.cuts`, with
when Redis answered again, so a test can measure from that moment.

The proxy runs its own event loop in a thread of its own: it forwards while
the test's loop (or the test's blocking code) is busy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 seconds: closing sends a reset, as a dead peer's network does."""


@dataclass(frozen=True)
class Cut:
    """One outage: every connection reset at ``started``; Redis answers again from ``ended``
    (both monotonic)."""

    started: float
    ended: float


class RedisCutter:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="redis-cutter", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._links: set[_Link] = set()
        self._down_until = 0.0
        self._repeating: concurrent.futures.Future[None] | None = None
        self.port = 0
        self.cuts: list[Cut] = []
        """Every cut so far, in order."""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> RedisCutter:
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # -- outages ---------------------------------------------------------------------------

    def cut(self, seconds: float) -> Cut:
        """Reset every connection now; reset each new one for ``seconds``. Returns at once."""
        return self._call(self._cut(seconds))

    def cut_repeatedly(self, *, times: int, down: float, up: float) -> None:
        """``times`` cuts of ``down`` seconds each, ``up`` seconds apart, in the proxy's
        thread; returns at once (:meth:`wait_repeated` waits for the last)."""
        self._repeating = asyncio.run_coroutine_threadsafe(self._repeat(times, down, up), self._loop)

    def wait_repeated(self, timeout: float) -> None:
        """Until the cuts :meth:`cut_repeatedly` started are over."""
        assert self._repeating is not None, "cut_repeatedly was not called"
        self._repeating.result(timeout)

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    # -- the proxy's loop ------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._repeating is not None:
            self._repeating.cancel()
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.reset()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _cut(self, seconds: float) -> Cut:
        now = time.monotonic()
        self._down_until = now + seconds
        for link in list(self._links):
            link.reset()
        cut = Cut(now, self._down_until)
        self.cuts.append(cut)
        return cut

    async def _repeat(self, times: int, down: float, up: float) -> None:
        for _ in range(times):
            await self._cut(down)
            await asyncio.sleep(down + up)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Ended by stop() too: a handler asyncio's streams see cancelled is logged as an error.
        with contextlib.suppress(asyncio.CancelledError):
            await self._forward(reader, writer)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        pumps = [
            asyncio.ensure_future(_pump(reader, up_writer)),
            asyncio.ensure_future(_pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            link.reset()
            self._links.discard(link)


@dataclass(eq=False)
class _Link:
    """One client's connection and the proxy's connection to Redis for it."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter

    def reset(self) -> None:
        _reset(self.client)
        _reset(self.server)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # closed already
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


@contextmanager
def redis_cutter(upstream_url: str) -> Iterator[RedisCutter]:
    """A started proxy in front of ``upstream_url``; stopped (every connection reset) at the end."""
    cutter = RedisCutter(upstream_url).start()
    try:
        yield cutter
    finally:
        cutter.stop()
