"""Console sessions ended by logout, so that a logged-out cookie is refused.

A session cookie is signed, not stored: without this, a copy of it would stay
good until it expires. Logout writes a digest of the session's id to Redis
(:meth:`MailKeys.console_ended`), kept until the cookie would have expired anyway,
and every console process reading the same Redis refuses the cookie from then.
This module is the only one that reads or writes those keys.
"""

from __future__ import annotations

import hashlib
import time

import redis.asyncio
from aiohttp import web

from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["SESSIONS", "EndedSessions"]


class EndedSessions:
    """Which session ids were ended by a logout."""

    def __init__(self, client: redis.asyncio.Redis, keys: MailKeys) -> None:
        self._redis = client
        self._keys = keys

    def _key(self, session_id: str) -> str:
        return self._keys.console_ended(hashlib.sha256(session_id.encode()).hexdigest()[:32])

    async def end(self, session_id: str, expires: float) -> None:
        """The session is over; ``expires``: when its cookie expires (epoch seconds)."""
        seconds = max(1, int(expires - time.time()) + 1)
        await self._redis.set(self._key(session_id), "1", ex=seconds)

    async def ended(self, session_id: str) -> bool:
        return bool(await self._redis.exists(self._key(session_id)))


SESSIONS = web.AppKey("sessions", EndedSessions)
