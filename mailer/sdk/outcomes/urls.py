"""Which webhook URLs fairpost may call: SSRF-safe by default.

A tenant-supplied URL must not reach the cluster's own services (Redis, the
metadata service at 169.254.169.254, a pod's localhost). So an endpoint is an
``https://`` URL without credentials, whose host resolves to public addresses
only, checked when it is added (:func:`check_url`) and again at each delivery
on the very addresses connected to (the daemon's resolver uses
:func:`is_public`). ``FAIRPOST_WEBHOOK_ALLOW_PRIVATE=true`` lifts both rules,
``http://`` included, for a receiver inside the cluster and for tests.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from fairpost.mailer.errors import InvalidWebhook

__all__ = ["MAX_URL_CHARS", "check_url", "is_public"]

MAX_URL_CHARS = 2000
Resolver = Callable[[str, int], list[str]]


def is_public(address: str) -> bool:
    """Whether an IP address is on the public internet (not private, loopback,
    link-local, reserved, multicast, nor one of those inside IPv4-mapped IPv6)."""
    try:
        ip: Any = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(ip.is_global) and not ip.is_multicast


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (blocking)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def check_url(url: object, *, allow_private: bool, resolver: Resolver = resolve) -> str:
    """The URL, if fairpost may deliver to it; :class:`InvalidWebhook` naming the rule if not."""
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
    try:
        addresses = resolver(parts.hostname, port or (443 if parts.scheme == "https" else 80))
    except (OSError, UnicodeError):
        raise InvalidWebhook("url", "its host does not resolve") from None
    if not addresses or not all(is_public(a) for a in addresses):
        raise InvalidWebhook(
            "url",
            "its host must resolve to public addresses only "
            "(FAIRPOST_WEBHOOK_ALLOW_PRIVATE=true allows private ones)",
        )
    return url
