"""One delivery attempt: a signed POST to an endpoint, safe against SSRF.

The connection goes only to public addresses (unless FAIRPOST_WEBHOOK_ALLOW_PRIVATE):
the resolver drops a host that resolves to any other (:class:`PublicResolver`,
checked on the very addresses connected to, so DNS rebinding gains nothing),
and an IP literal is checked before. No redirect is followed, no proxy from the
environment is used, the answer's body is read up to :data:`MAX_RESPONSE_BYTES`,
and the whole attempt ends after FAIRPOST_WEBHOOK_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from fairpost.config import Settings
from fairpost.mailer.errors import AddressNotPublic, InvalidWebhook
from fairpost.mailer.sdk.outcomes.urls import check_url, is_public

__all__ = ["MAX_RESPONSE_BYTES", "Answer", "Poster", "PublicResolver", "retry_after"]

MAX_RESPONSE_BYTES = 1024
"""What is read of an endpoint's answer: its length and digest are kept in its
attempts, and (private addresses not allowed) its first 200 characters."""

DNS_CACHE_SECONDS = 60
"""How long a name's addresses are reused: an endpoint behind a load balancer
moves, and each new answer is checked again by :class:`PublicResolver`."""

RESULTS = ("delivered", "http_error", "gone", "timeout", "connection", "blocked")
"""What an attempt came to: a 2xx; another status; 410; no answer in time; no
connection (refused, reset, unresolvable); an address fairpost may not call."""


class PublicResolver(AbstractResolver):
    """Resolves as the system does, and refuses a host with any non-public address."""

    def __init__(self, allow_private: bool, *, inner: AbstractResolver | None = None) -> None:
        self._inner = inner or aiohttp.ThreadedResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if not self._allow_private and not all(is_public(r["host"]) for r in found):
            raise AddressNotPublic("the endpoint's host resolves to an address that is not public")
        return found

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True)
class Answer:
    result: str
    """One of :data:`RESULTS`."""
    status: int | None
    retry_after: float | None
    """Seconds the endpoint asked to wait (``Retry-After``), if it did."""
    error: str | None
    response: str | None
    """The start of the answer's body; None with FAIRPOST_WEBHOOK_ALLOW_PRIVATE (a
    private service's text kept would turn a blind SSRF into a read)."""
    seconds: float
    response_bytes: int = 0
    """How much of the body was read (at most :data:`MAX_RESPONSE_BYTES`)."""
    response_sha256: str | None = None
    """The hex digest of what was read; None without an answer."""


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(min(int(value[:9]), 10**8))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class Poster:
    """Makes delivery attempts over one connection pool (close it with :meth:`close`)."""

    def __init__(self, settings: Settings, *, inner: AbstractResolver | None = None) -> None:
        """``inner``: the resolver asked before the check (the system's; a test's stand-in)."""
        hooks = settings.webhook
        self._allow_private = hooks.allow_private
        connector = aiohttp.TCPConnector(
            resolver=PublicResolver(hooks.allow_private, inner=inner),
            limit=hooks.concurrency,
            ttl_dns_cache=DNS_CACHE_SECONDS,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=hooks.timeout_seconds),
            trust_env=False,
            auto_decompress=False,
        )

    async def close(self) -> None:
        await self._session.close()

    async def post(self, url: str, headers: dict[str, str], body: str) -> Answer:
        started = time.monotonic()

        def answer(
            result: str, status: int | None = None, error: str | None = None, **more: object
        ) -> Answer:
            after = more.get("retry_after")
            raw = more.get("raw")
            took = time.monotonic() - started
            if not isinstance(raw, bytes):
                return Answer(result, status, after if isinstance(after, float) else None, error, None, took)
            shown = None if self._allow_private else raw.decode("utf-8", "replace")[:200]
            wait = after if isinstance(after, float) else None
            return Answer(result, status, wait, error, shown, took, len(raw), hashlib.sha256(raw).hexdigest())

        refused = self._refused(url)
        if refused is not None:
            return answer("blocked", error=refused)
        try:
            async with self._session.post(
                url, data=body.encode(), headers=headers, allow_redirects=False
            ) as r:
                raw = await r.content.read(MAX_RESPONSE_BYTES)
                wait = retry_after(r.headers.get("Retry-After"))
                if 200 <= r.status < 300:
                    return answer("delivered", r.status, raw=raw)
                result = "gone" if r.status == 410 else "http_error"
                return answer(result, r.status, f"HTTP {r.status}", raw=raw, retry_after=wait)
        except TimeoutError:
            return answer("timeout", error="no answer in time")
        except (aiohttp.ClientError, OSError) as exc:
            not_public = _refusal(exc)
            if not_public is not None:
                return answer("blocked", error=str(not_public))
            return answer("connection", error=f"{type(exc).__name__}: {str(exc)[:200]}")

    def _refused(self, url: str) -> str | None:
        """Why this URL may not be called now (the check ``add`` made, again at each
        delivery; a name is left to the resolver, which checks what it answers), or None."""
        try:
            check_url(url, allow_private=self._allow_private, resolver=None)
        except InvalidWebhook as exc:
            return f"the endpoint's URL: {exc.rule}"
        return None


def _refusal(exc: BaseException) -> AddressNotPublic | None:
    """The resolver's refusal inside what aiohttp raised (it wraps resolver errors)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes is short; never follow a loop
        if seen is None or isinstance(seen, AddressNotPublic):
            return seen
        seen = seen.__cause__ or getattr(seen, "os_error", None)
    return None
