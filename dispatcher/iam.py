"""IAM authentication to ElastiCache and MemoryDB: a SigV4 token as the password.

ElastiCache and MemoryDB take, for an IAM-enabled user, a token in place of a
password: a SigV4-presigned ``GET https://<cache>/?Action=connect&User=<user>``
without its scheme, signed with the caller's AWS credentials for the service
(``elasticache`` or ``memorydb``). A token is good for 15 minutes, but only to
authenticate: a connection opened with it lives on, until the service cuts it
after 12 hours.

So :class:`TokenProvider`, a redis-py ``CredentialProvider``, mints a token for
every new connection (a local HMAC, no call to AWS; botocore refreshes the
credentials themselves when they near their end, an assumed role's or a pod's),
and :func:`renewing` makes a connection that has lived ``max_connection_age``
(11 hours by default) reconnect, with a new token, the next time its pool hands
it out, between two commands, so the service never cuts one in use.

botocore is imported here only when a process is configured for IAM, and by
nothing else the SDK imports (pyproject.toml's import-linter contract names
this one exception): an application that does not use IAM does not need it.
Which processes do: every one that talks to Redis (``fairpost run``, the
console, the commands, and the applications' SDK), so ``fairpost[iam]``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

from redis.credentials import CredentialProvider

from fairpost.config import ConfigError
from fairpost.config.sections import RedisIamSettings

__all__ = ["TOKEN_SECONDS", "TokenProvider", "renewing", "sigv4_minter", "token_provider"]

TOKEN_SECONDS = 900
"""How long a token lets a connection authenticate: 15 minutes, as the services take."""

Mint = Callable[[], str]


class TokenProvider(CredentialProvider):
    """The IAM user and a freshly minted token, for each connection redis-py opens."""

    def __init__(self, user: str, mint: Mint) -> None:
        self.user = user
        self._mint = mint

    def get_credentials(self) -> tuple[str, str]:
        return self.user, self._mint()

    async def get_credentials_async(self) -> tuple[str, str]:
        # botocore may refresh credentials over the network (an assumed role): off the loop.
        return await asyncio.to_thread(self.get_credentials)


def token_provider(iam: RedisIamSettings) -> TokenProvider:
    return TokenProvider(iam.user, sigv4_minter(iam))


def sigv4_minter(iam: RedisIamSettings) -> Mint:
    """The SigV4 token for ``iam``'s user and cache, signed anew at each call."""
    try:
        import botocore.session
        from botocore.model import ServiceId
        from botocore.signers import RequestSigner
    except ImportError:
        raise ConfigError(
            [("FAIRPOST_REDIS_IAM__USER", "IAM authentication needs botocore: pip install 'fairpost[iam]'")]
        ) from None
    session = botocore.session.get_session()
    region = iam.region or session.get_config_variable("region")
    if not region:
        raise ConfigError([("FAIRPOST_REDIS_IAM__REGION", "no AWS region: set it, or AWS_DEFAULT_REGION")])
    credentials = session.get_credentials()
    if credentials is None:
        raise ConfigError(
            [("FAIRPOST_REDIS_IAM__USER", "no AWS credentials to sign the token with (variables, role)")]
        )
    signer = RequestSigner(
        ServiceId(iam.service), region, iam.service, "v4", credentials, session.get_component("event_emitter")
    )
    query = {"Action": "connect", "User": iam.user}
    if iam.serverless:
        query["ResourceType"] = "ServerlessCache"
    url = f"https://{iam.cache_name}/?{urlencode(query)}"

    def mint() -> str:
        request = {"method": "GET", "url": url, "body": {}, "headers": {}, "url_path": "/", "context": {}}
        signed: str = signer.generate_presigned_url(
            request, operation_name="connect", expires_in=TOKEN_SECONDS, region_name=region
        )
        return signed.removeprefix("https://")  # the services take it without the scheme

    return mint


# -- connections that renew themselves before the 12-hour cut ---------------------------

_C = TypeVar("_C")


class _SyncRenewal:
    max_age: float

    def connect(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None and time.monotonic() - getattr(self, "_born", 0.0) >= self.max_age:
            self.disconnect()  # type: ignore[attr-defined]
        super().connect()  # type: ignore[misc]

    def on_connect_check_health(self, check_health: bool = True) -> None:
        self._born = time.monotonic()
        super().on_connect_check_health(check_health)  # type: ignore[misc]

    def on_connect(self) -> None:  # redis-py 5's hook; 6 routes it to the one above
        self._born = time.monotonic()
        super().on_connect()  # type: ignore[misc]


class _AsyncRenewal:
    max_age: float

    async def connect(self) -> None:
        old = time.monotonic() - getattr(self, "_born", 0.0) >= self.max_age
        if getattr(self, "_reader", None) is not None and old:
            await self.disconnect()  # type: ignore[attr-defined]
        await super().connect()  # type: ignore[misc]

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        self._born = time.monotonic()
        await super().on_connect_check_health(check_health)  # type: ignore[misc]

    async def on_connect(self) -> None:  # redis-py 5's hook; 6 routes it to the one above
        self._born = time.monotonic()
        await super().on_connect()  # type: ignore[misc]


def renewing(base: type[_C], max_age: float, *, asyncio_class: bool = False) -> type[_C]:
    """``base`` (a redis-py connection class), reconnecting once ``max_age`` seconds old.

    The pool calls ``connect`` on every connection it hands out, and only then: the
    renewal falls between commands, never inside a pipeline or a transaction."""
    mixin: type[Any] = _AsyncRenewal if asyncio_class else _SyncRenewal
    return type(f"Renewing{base.__name__}", (mixin, base), {"max_age": max_age})
