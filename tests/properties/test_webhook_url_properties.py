"""The webhook URL check: any URL, resolving to any addresses, is taken or refused
with ``InvalidWebhook`` (nothing else), and nothing is taken that a stricter
oracle refuses: Python's ``ipaddress`` on the address and on every IPv4 address
an IPv6 form carries (mapped, compatible, translated, NAT64, 6to4, Teredo)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from hypothesis import example, given
from hypothesis import strategies as st

from fairpost.mailer.errors import InvalidWebhook
from fairpost.mailer.sdk.outcomes.urls import check_url, is_public
from tests.properties.strategies import TEXT

NAT64 = ipaddress.ip_network("64:ff9b::/96")
COMPAT = ipaddress.ip_network("::/96")
TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")

V4 = st.ip_addresses(v=4)
EMBEDDED = st.one_of(
    V4.map(lambda a: ipaddress.IPv6Address(int(ipaddress.ip_address("::ffff:0:0")) | int(a))),
    V4.map(lambda a: ipaddress.IPv6Address(int(a))),
    V4.map(lambda a: ipaddress.IPv6Address(int(TRANSLATED.network_address) | int(a))),
    V4.map(lambda a: ipaddress.IPv6Address(int(NAT64.network_address) | int(a))),
    V4.map(lambda a: ipaddress.IPv6Address((0x2002 << 112) | (int(a) << 80))),
    st.tuples(V4, V4).map(
        lambda p: ipaddress.IPv6Address((0x20010000 << 96) | (int(p[0]) << 64) | (~int(p[1]) & 0xFFFFFFFF))
    ),
)
ADDRESSES = st.one_of(V4, st.ip_addresses(v=6), EMBEDDED).map(str)


def carried(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address this IPv6 address may carry, as each form would read it."""
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in NAT64 or ip in COMPAT or ip in TRANSLATED:
        found.append(low)
    return found


def oracle_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if not ip.is_global or ip.is_multicast:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        return all(v4.is_global and not v4.is_multicast for v4 in carried(ip))
    return True


@given(ADDRESSES)
@example("::127.0.0.1")
@example("64:ff9b::a9fe:a9fe")
@example("2002:7f00:1::")
@example("::ffff:0:7f00:1")
def test_an_address_taken_is_public_to_the_unwrapping_oracle(address: str) -> None:
    if is_public(address):
        assert oracle_public(address), address


@given(TEXT, st.lists(ADDRESSES, max_size=3))
def test_any_url_is_taken_or_refused_naming_the_url(url: str, resolved: list[str]) -> None:
    check(url, resolved)


@given(
    st.sampled_from(["https", "http", "HTTPS", "ftp", ""]),
    st.one_of(ADDRESSES.map(lambda a: f"[{a}]" if ":" in a else a), TEXT, st.just("hooks.example.com")),
    st.one_of(st.just(""), st.integers(0, 70000).map(lambda p: f":{p}"), TEXT),
    st.one_of(st.just("/x"), TEXT),
    st.lists(ADDRESSES, max_size=3),
)
def test_urls_of_any_host_and_port(scheme: str, host: str, port: str, path: str, resolved: list[str]) -> None:
    check(f"{scheme}://{host}{port}{path}", resolved)


def check(url: str, resolved: list[str]) -> None:
    try:
        taken = check_url(url, allow_private=False, resolver=lambda host, port: resolved)
    except InvalidWebhook as exc:
        assert exc.field == "url" and exc.rule
        return
    parts = urlsplit(taken)
    assert parts.scheme == "https" and parts.hostname and parts.username is None
    assert not any(c.isspace() or ord(c) < 32 for c in taken)
    try:
        literal = [str(ipaddress.ip_address(parts.hostname))]
    except ValueError:
        literal = []
    assert all(oracle_public(a) for a in literal or resolved), (taken, resolved)
    assert literal or resolved
