"""Which IP addresses a webhook may reach: the public internet, nothing else.

Python's ``is_global`` is not enough on its own: it calls NAT64 (``64:ff9b::/96``),
6to4, IPv4-compatible and IPv4-translated addresses global (Python 3.11 to 3.13),
and so would let ``[64:ff9b::a9fe:a9fe]`` reach the metadata service through a
NAT64 gateway. So :func:`is_public` refuses every range of IANA's IPv4 and IPv6
special-purpose address registries (:data:`NOT_PUBLIC`, even those the registry
marks globally reachable: an anycast relay or AS112 is never a webhook
receiver), and unwraps the IPv6 forms that carry an IPv4 address before it
checks them.
"""

from __future__ import annotations

import ipaddress

__all__ = ["NOT_PUBLIC", "is_public", "unwrap"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4 = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24", "192.88.99.0/24",
    "192.168.0.0/16", "192.175.48.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "224.0.0.0/4", "240.0.0.0/4",
)  # fmt: skip
"""IANA's IPv4 special-purpose registry (2025), multicast, and the reserved block
(which holds the limited broadcast address)."""

_V6 = (
    "::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b:1::/48", "100::/64", "100:0:0:1::/64",
    "2001::/23", "2001:db8::/32", "2002::/16", "2620:4f:8000::/48", "3fff::/20", "5f00::/16",
    "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
)  # fmt: skip
"""IANA's IPv6 special-purpose registry (2025), multicast and site-local. ``::/96``
holds the unspecified and loopback addresses and the IPv4-compatible form;
``2001::/23`` holds Teredo (``2001::/32``), ORCHID, AMT, AS112 and the anycast
addresses; ``2002::/16`` is 6to4. The well-known NAT64 prefix ``64:ff9b::/96``
is not here: :func:`unwrap` checks the IPv4 address inside it instead, since
an IPv6-only subnet's DNS64 answers every public name so."""

NOT_PUBLIC: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(n) for n in (*_V4, *_V6))

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv4-mapped or well-known-prefix NAT64 address carries;
    any other address as it is. (The other embedding forms are refused whole.)"""
    if isinstance(ip, ipaddress.IPv6Address) and (ip in _NAT64 or ip in _MAPPED):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def is_public(address: str) -> bool:
    """Whether an IP address (text, an IPv6 zone allowed) is on the public internet.

    The one check every webhook path uses: the URL's literal at ``add``, ``enable``,
    ``replay`` and before each delivery, and each address the resolver answers at
    connect time (mailer/daemon/webhooks/post.py)."""
    try:
        ip = unwrap(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return False
    if any(ip.version == network.version and ip in network for network in NOT_PUBLIC):
        return False
    return ip.is_global and not ip.is_multicast
