"""Which webhook URLs fairpost may call: SSRF-safe by default.

A tenant-supplied URL must not reach the cluster's own services (Redis, the
metadata service at 169.254.169.254, a pod's localhost). So an endpoint is an
``https://`` URL without credentials, whose host resolves to public addresses
only (:func:`~fairpost.mailer.sdk.outcomes.special.is_public`). :func:`check_url`
is the one URL check: at ``add``, ``enable`` and ``replay``, and before each
delivery (which leaves a name to the daemon's resolver: it checks the very
addresses connected to). ``FAIRPOST_WEBHOOK_ALLOW_PRIVATE=true`` lifts both rules,
``http://`` included, for a receiver inside the cluster and for tests.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from fairpost.mailer.errors import InvalidWebhook
from fairpost.mailer.sdk.outcomes.special import is_public

__all__ = ["MAX_URL_CHARS", "NOT_PUBLIC_RULE", "check_url", "is_public"]

MAX_URL_CHARS = 2000
Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (blocking)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


NOT_PUBLIC_RULE = (
    "its host is not public: public addresses only (FAIRPOST_WEBHOOK_ALLOW_PRIVATE=true allows private ones)"
)


def check_url(url: object, *, allow_private: bool, resolver: Resolver | None = resolve) -> str:
    """The URL, if fairpost may deliver to it; :class:`InvalidWebhook` naming the rule if not.

    An IP literal is checked as it is; a name by what ``resolver`` answers, or (None)
    not here: at delivery the connection's own resolver checks it."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidWebhook("url", f"must be a URL of 1 to {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidWebhook("url", f"is not a valid URL ({exc})") from None
    schemes = ("https", "http") if allow_private else ("https",)
    if parts.scheme not in schemes:
        rule = "must be https://" + (
            "" if allow_private else " (http:// only with FAIRPOST_WEBHOOK_ALLOW_PRIVATE=true)"
        )
        raise InvalidWebhook("url", rule)
    if not parts.hostname:
        raise InvalidWebhook("url", "must name a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhook("url", "must carry no credentials (user:password@)")
    if parts.fragment or any(c.isspace() or ord(c) < 32 for c in url):
        raise InvalidWebhook("url", "must have no fragment, spaces or control characters")
    if allow_private:
        return url
    if _is_literal(parts.hostname):
        addresses = [parts.hostname]
    elif resolver is None:
        return url
    else:
        try:
            addresses = resolver(parts.hostname, port or (443 if parts.scheme == "https" else 80))
        except (OSError, UnicodeError):
            raise InvalidWebhook("url", "its host does not resolve") from None
    if not addresses or not all(is_public(a) for a in addresses):
        raise InvalidWebhook("url", NOT_PUBLIC_RULE)
    return url


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True
