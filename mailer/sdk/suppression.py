"""Per-tenant suppression lists: addresses a tenant's mail is never sent to again.

A permanent bounce or a complaint SES reports for a tenant's mail puts the
address on *that tenant's* list (other tenants may still write to it); an
operator adds or removes addresses by hand (``fairpost suppression``, or
:class:`Suppressions` from an admin tool). The sender drops a suppressed
recipient before sending; a mail left with none ends ``suppressed``.

One hash per tenant (:meth:`fairpost.mailer.sdk.keys.MailKeys.suppressed`): the address in
lower case → ``"<reason> <ms>"``. A look-up is one ``HMGET`` per group of
mail, whatever the list's length. This module owns the format: everything
else reads and writes the lists through it.

>>> with Suppressions() as lists:
...     lists.add("acme", "ada@example.com")
...     [entry.address for entry in lists.list("acme")]
['ada@example.com']
"""

from __future__ import annotations

import contextlib
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parseaddr
from typing import Any, Literal

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import pool_key_prefix
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id
from fairpost.dispatcher.replies import Queued, text, time_ms
from fairpost.mailer.errors import InvalidSuppression
from fairpost.mailer.sdk.connection import RedisOwner, timeouts
from fairpost.mailer.sdk.directory import PoolDirectory
from fairpost.mailer.sdk.failures import redis_operation
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.pool_redis import SyncPoolRedis

__all__ = [
    "Reason",
    "Suppression",
    "Suppressions",
    "checked_address",
    "checked_tenant",
    "normalize",
    "suppress",
    "suppressed_among",
]

Reason = Literal["bounce", "complaint", "manual"]
_REASONS = ("bounce", "complaint", "manual")


_PLAIN = frozenset(string.ascii_letters + string.digits + "!#$%&'*+/=?^_`{|}~.-@")
"""The characters of a plain address (RFC 5322 atext, dots, one "@"), which
``parseaddr`` gives back as it is: nearly every recipient a sender reads."""


def normalize(address: str) -> str:
    """The form an address is kept in: its bare address (no display name), lower case,
    its domain in Punycode as a mail carries it to SES (mailer/sdk/mail.py)."""
    local, at, domain = address.partition("@")
    if local and domain and "@" not in domain and _PLAIN.issuperset(address):
        # Parsing it would change nothing, and costs about 25 times as much: the
        # sender normalizes each recipient up to three times (suppressions, rollups).
        return address.lower()
    bare = parseaddr(address)[1].strip().lower()
    local, at, domain = bare.rpartition("@")
    if at and not domain.isascii():
        import idna  # IDNA 2008, as email-validator encodes mail's domains

        # Not a domain at all: kept as given, and refused where it is checked.
        with contextlib.suppress(idna.IDNAError):
            domain = idna.encode(domain, uts46=True).decode("ascii")
    return f"{local}{at}{domain}"


@dataclass(frozen=True)
class Suppression:
    address: str
    reason: str
    """``bounce`` (permanent), ``complaint`` or ``manual``."""
    since: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "reason": self.reason,
            "since": None if self.since is None else self.since.isoformat(),
        }


def _value(reason: Reason, at_ms: int) -> str:
    return f"{reason} {at_ms}"


def _parse(address: str, value: str) -> Suppression:
    reason, _, ms = value.partition(" ")
    since = datetime.fromtimestamp(int(ms) / 1000, tz=UTC) if ms.isdigit() else None
    return Suppression(address, reason, since)


async def suppressed_among(
    client: redis.asyncio.Redis | redis.asyncio.client.Pipeline,
    keys: MailKeys,
    tenant: str,
    addresses: Iterable[str],
) -> set[str]:
    """Which of ``addresses`` (as given) are on the tenant's list: one ``HMGET``."""
    given = list(dict.fromkeys(addresses))
    if not given:
        return set()
    values = await client.hmget(keys.suppressed(tenant), [normalize(a) for a in given])
    return _on_the_list(given, values)


def ask_suppressed_among(
    pipe: redis.asyncio.client.Pipeline, keys: MailKeys, tenant: str, addresses: Iterable[str]
) -> Queued[set[str]]:
    """:func:`suppressed_among`, queued on ``pipe`` beside the caller's other reads."""
    given = list(dict.fromkeys(addresses))
    if not given:
        return Queued(0, lambda _: set())
    pipe.hmget(keys.suppressed(tenant), [normalize(a) for a in given])
    return Queued(1, lambda replies: _on_the_list(given, replies[0]))


def _on_the_list(given: list[str], values: Sequence[Any]) -> set[str]:
    return {address for address, value in zip(given, values, strict=True) if value is not None}


async def suppress(
    client: redis.asyncio.Redis,
    keys: MailKeys,
    tenant: str,
    addresses: Iterable[str],
    reason: Reason,
    at_ms: int,
) -> int:
    """Put addresses on the tenant's list (a first reason is kept); returns how many were new."""
    fields = {normalize(a): _value(reason, at_ms) for a in addresses if normalize(a)}
    if not fields:
        return 0
    async with client.pipeline(transaction=False) as pipe:
        for address, value in fields.items():
            pipe.hsetnx(keys.suppressed(tenant), address, value)
        added = await pipe.execute()
    return sum(1 for a in added if a)


class Suppressions(RedisOwner):
    """The suppression lists, for admin tools (what ``fairpost suppression`` uses).

    Blocking; needs only the SDK's dependencies. Bad input raises
    :class:`fairpost.mailer.errors.InvalidSuppression` naming the field and writes nothing.
    """

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.keys = MailKeys(self.settings.key_prefix)
        self._directory = PoolDirectory(self.settings, self._redis, ttl=0.0)
        self._pools = SyncPoolRedis(self.settings, self._redis, **timeouts(self.settings))

    def close(self) -> None:
        self._pools.close()
        super().close()

    def _list_keys(self, tenant: object) -> list[tuple[redis.Redis, str]]:
        """The tenant's list in the pool it is on (its sender reads it there), first; while it
        moves, also in the pool its waiting mail drains from (mailer/sdk/pool_admin.py)."""
        valid = checked_tenant(tenant)
        pools = [self._directory.pool_of(valid)]
        move = self._directory.move(valid) if self.settings.pools else None
        if move is not None and move["from"] not in pools:
            pools.append(str(move["from"]))
        return [
            (self._pools(p), MailKeys(pool_key_prefix(self.settings, p)).suppressed(valid)) for p in pools
        ]

    @redis_operation("suppression: list")
    def list(self, tenant: str) -> list[Suppression]:
        """The tenant's suppressed addresses, sorted."""
        [(client, key), *_] = self._list_keys(tenant)
        raw: dict[Any, Any] = client.hgetall(key)
        return sorted((_parse(text(k), text(v)) for k, v in raw.items()), key=lambda e: e.address)

    @redis_operation("suppression: check")
    def is_suppressed(self, tenant: str, address: str) -> bool:
        [(client, key), *_] = self._list_keys(tenant)
        return bool(client.hexists(key, checked_address(address)))

    @redis_operation("suppression: add", writes=True)
    def add(self, tenant: str, address: str, reason: Reason = "manual") -> bool:
        """Suppress an address for the tenant; False if it was already."""
        if reason not in _REASONS:
            raise InvalidSuppression("reason", f"must be one of {', '.join(_REASONS)}, got {reason!r}")
        lists, field = self._list_keys(tenant), checked_address(address)
        now_ms = time_ms(self._redis.time())  # every stored time is Redis time
        added = [bool(client.hsetnx(key, field, _value(reason, now_ms))) for client, key in lists]
        return added[0]

    @redis_operation("suppression: remove", writes=True)
    def remove(self, tenant: str, address: str) -> bool:
        """Let the tenant write to the address again; False if it was not suppressed."""
        lists = self._list_keys(tenant)
        removed = [bool(client.hdel(key, checked_address(address))) for client, key in lists]
        return removed[0]


def checked_tenant(tenant: object) -> str:
    if not is_valid_tenant_id(tenant):
        raise InvalidSuppression("tenant", f"must be {TENANT_ID_RULE}, got {tenant!r}")
    assert isinstance(tenant, str)
    return tenant


def checked_address(address: object) -> str:
    from email_validator import EmailNotValidError, validate_email

    if not isinstance(address, str):
        raise InvalidSuppression("address", "must be an e-mail address")
    bare = normalize(address)
    try:
        validate_email(bare, check_deliverability=False)
    except EmailNotValidError:
        raise InvalidSuppression("address", "must be one e-mail address (name@domain)") from None
    return bare
