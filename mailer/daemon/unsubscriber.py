"""What an unsubscribe does, by link or by mail: verify the token, then unsubscribe
at once (fairpost.mailer.sdk.unsubscribes), its event in the outcome feed, counted
in the tenant's deliverability rollups.

Shared by ``fairpost unsubscribe-server`` (the https link) and the SES event
consumer (the ``mailto:`` address: SES receives the mail and notifies the events
queue, fairpost.mailer.daemon.events).
"""

from __future__ import annotations

import logging
import time

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import pool_settings
from fairpost.mailer.errors import InvalidToken
from fairpost.mailer.sdk.directory import AsyncPoolDirectory
from fairpost.mailer.sdk.list_unsubscribe import MAILTO_PREFIX
from fairpost.mailer.sdk.pool_redis import AsyncPoolRedis
from fairpost.mailer.sdk.unsub_token import Token, verify
from fairpost.mailer.sdk.unsubscribes import EVERY_TOPIC, unsubscribe

__all__ = ["Unsubscriber"]

log = logging.getLogger("fairpost.unsubscribe")


class Unsubscriber:
    def __init__(self, settings: Settings, client: redis.asyncio.Redis) -> None:
        self.keys = [k.get_secret_value().encode() for k in settings.unsubscribe.keys]
        self.mailto_domain = (settings.unsubscribe.mailto_domain or "").lower()
        self.client = client
        self.settings = settings
        # Sending pools (#43): a tenant's unsubscribes are kept in the pool it is on.
        self._directory = AsyncPoolDirectory(settings, client)
        self._pools = AsyncPoolRedis(settings, client)

    async def aclose(self) -> None:
        """Close the other pools' clients it opened (a Redis Cluster's); not ``client``."""
        await self._pools.aclose()

    def token(self, text: str) -> Token:
        """The token, or :class:`InvalidToken`."""
        return verify(text, self.keys, time.time())

    def mailto_token(self, address: str) -> Token | None:
        """The valid token of an unsubscribe address (``u-<token>@<mailto domain>``);
        None for any other address or a bad token."""
        local, _, domain = address.strip().lower().rpartition("@")
        if not self.mailto_domain or domain != self.mailto_domain or not local.startswith(MAILTO_PREFIX):
            return None
        try:
            return self.token(local[len(MAILTO_PREFIX) :])
        except InvalidToken as exc:
            log.info("unsubscribe mail with a token refused: %s", exc.reason)
            return None

    async def apply(self, token: Token, *, whole_tenant: bool, source: str) -> bool:
        """Unsubscribe the token's address from its topic (or every topic of its tenant);
        False if it was already."""
        topic = EVERY_TOPIC if whole_tenant else token.topic
        pool = await self._directory.pool_of(token.tenant)
        own = pool_settings(self.settings, pool)
        changed = await unsubscribe(self._pools(pool), own, token.tenant, token.address, topic, source)
        log.info("unsubscribed (%s)", source, extra={"tenant": token.tenant})
        return changed
