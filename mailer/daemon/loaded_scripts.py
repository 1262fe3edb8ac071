"""Pipelines of scripts this process has seen loaded: no ``SCRIPT EXISTS`` before each.

redis-py asks ``SCRIPT EXISTS`` for a pipeline's scripts before every pipeline
that calls one (its ``EVALSHA`` fails with ``NOSCRIPT`` otherwise, and a pipeline
cannot load and call again as a lone call does): a round trip of its own, once a
group's record (fairpost.mailer.daemon.answers), where the round trips are what
the daemon's CPU a mail goes to beside the calls it cannot avoid
(BENCHMARKS.md, #41). Once a pipeline's scripts ran, they are loaded on the
server; later pipelines of only those skip the question. A server that lost
them (a restart, a failover to a replica that never loaded them, ``SCRIPT
FLUSH``) answers ``NOSCRIPT``: everything is forgotten and the error raised
(any error forgets them: one may hide a ``NOSCRIPT`` behind it), and the
caller's retry (its writes must be safe to run again, as for any failure
part-way through a pipeline) asks again and loads them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio.client

__all__ = ["LoadedScripts"]

_T = TypeVar("_T")


class LoadedScripts:
    def __init__(self) -> None:
        self._known: set[str] = set()

    async def execute(
        self,
        pipe: redis.asyncio.client.Pipeline,
        run: Callable[[redis.asyncio.client.Pipeline], Awaitable[_T]],
    ) -> _T:
        """``run(pipe)`` (which executes ``pipe``), without redis-py's ``SCRIPT EXISTS``
        when every script queued on ``pipe`` is known to be loaded."""
        scripts = getattr(pipe, "scripts", None)  # a cluster's pipeline has none
        shas = {s.sha for s in scripts} if scripts else set()
        if scripts and shas <= self._known:
            scripts.clear()
        try:
            result = await run(pipe)
        except BaseException:
            # NOSCRIPT, or an error that may hide one behind it: asked again next time.
            self._known.clear()
            raise
        self._known |= shas
        return result
