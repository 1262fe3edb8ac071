"""No webhook reaches an address that is not on the public internet, however it is
written: every range of IANA's IPv4 and IPv6 special-purpose address registries,
and every IPv6 form that carries an IPv4 address (IPv4-mapped, IPv4-compatible,
IPv4-translated, NAT64, 6to4, Teredo). Each is refused at ``add`` (as a literal
and as what a name resolves to), at ``enable`` and ``replay``, and at delivery
(a literal before connecting, a name on the very addresses the resolver answers).

The registries: https://www.iana.org/assignments/iana-ipv4-special-registry and
https://www.iana.org/assignments/iana-ipv6-special-registry (as of 2025), plus
multicast (224.0.0.0/4, ff00::/8).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
from datetime import UTC, datetime

import pytest
import redis.asyncio
from aiohttp.abc import AbstractResolver, ResolveResult

from fairpost.config import load_settings
from fairpost.mailer.daemon.webhooks import post
from fairpost.mailer.daemon.webhooks.post import Poster, PublicResolver
from fairpost.mailer.errors import AddressNotPublic, InvalidWebhook
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.sdk.outcomes.urls import check_url, is_public
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.conftest import hook_settings
from tests.outcomes.receiver import Receiver
from tests.outcomes.test_webhooks import endpoint

KEYS = MailKeys()

SPECIAL_V4 = [
    ("0.0.0.0", "this network 0.0.0.0/8"),
    ("0.1.2.3", "this network 0.0.0.0/8"),
    ("10.0.0.1", "private 10.0.0.0/8"),
    ("100.64.0.1", "shared address space 100.64.0.0/10"),
    ("100.127.255.254", "shared address space 100.64.0.0/10"),
    ("127.0.0.1", "loopback 127.0.0.0/8"),
    ("127.255.255.254", "loopback 127.0.0.0/8"),
    ("169.254.169.254", "link-local 169.254.0.0/16 (the metadata service)"),
    ("172.16.0.1", "private 172.16.0.0/12"),
    ("172.31.255.254", "private 172.16.0.0/12"),
    ("192.0.0.1", "IETF protocol assignments 192.0.0.0/24"),
    ("192.0.0.8", "IPv4 dummy address 192.0.0.8/32"),
    ("192.0.0.9", "port control protocol anycast 192.0.0.9/32"),
    ("192.0.0.10", "TURN anycast 192.0.0.10/32"),
    ("192.0.0.170", "NAT64/DNS64 discovery 192.0.0.170/31"),
    ("192.0.2.1", "documentation TEST-NET-1 192.0.2.0/24"),
    ("192.31.196.1", "AS112-v4 192.31.196.0/24"),
    ("192.52.193.1", "AMT 192.52.193.0/24"),
    ("192.88.99.1", "deprecated 6to4 relay anycast 192.88.99.0/24"),
    ("192.168.1.1", "private 192.168.0.0/16"),
    ("192.175.48.1", "direct delegation AS112 192.175.48.0/24"),
    ("198.18.0.1", "benchmarking 198.18.0.0/15"),
    ("198.19.255.254", "benchmarking 198.18.0.0/15"),
    ("198.51.100.1", "documentation TEST-NET-2 198.51.100.0/24"),
    ("203.0.113.1", "documentation TEST-NET-3 203.0.113.0/24"),
    ("224.0.0.1", "multicast 224.0.0.0/4"),
    ("239.255.255.250", "multicast 224.0.0.0/4"),
    ("240.0.0.1", "reserved 240.0.0.0/4"),
    ("255.255.255.255", "limited broadcast"),
]

SPECIAL_V6 = [
    ("::", "unspecified ::/128"),
    ("::1", "loopback ::1/128"),
    ("100::1", "discard-only 100::/64"),
    ("100:0:0:1::1", "dummy IPv6 prefix 100:0:0:1::/64"),
    ("2001::1", "TEREDO 2001::/32 (and IETF protocol assignments 2001::/23)"),
    ("2001:1::1", "port control protocol anycast 2001:1::1/128"),
    ("2001:1::2", "TURN anycast 2001:1::2/128"),
    ("2001:1::3", "DNS-SD service registration protocol anycast 2001:1::3/128"),
    ("2001:2::1", "benchmarking 2001:2::/48"),
    ("2001:3::1", "AMT 2001:3::/32"),
    ("2001:4:112::1", "AS112-v6 2001:4:112::/48"),
    ("2001:10::1", "deprecated ORCHID 2001:10::/28"),
    ("2001:20::1", "ORCHIDv2 2001:20::/28"),
    ("2001:30::1", "drone remote ID 2001:30::/28"),
    ("2001:db8::1", "documentation 2001:db8::/32"),
    ("2620:4f:8000::1", "direct delegation AS112 2620:4f:8000::/48"),
    ("3fff::1", "documentation 3fff::/20"),
    ("5f00::1", "segment routing SIDs 5f00::/16"),
    ("fc00::1", "unique local fc00::/7"),
    ("fd12:3456::1", "unique local fc00::/7"),
    ("fe80::1", "link-local fe80::/10"),
    ("fec0::1", "deprecated site-local fec0::/10"),
    ("ff02::1", "multicast ff00::/8"),
    ("ff0e::1", "multicast ff00::/8"),
]

EMBEDDED = [
    ("::ffff:127.0.0.1", "IPv4-mapped ::ffff:0:0/96"),
    ("::ffff:169.254.169.254", "IPv4-mapped ::ffff:0:0/96"),
    ("::127.0.0.1", "IPv4-compatible ::/96"),
    ("::10.0.0.1", "IPv4-compatible ::/96"),
    ("::ffff:0:7f00:1", "IPv4-translated ::ffff:0:0:0/96"),
    ("::ffff:0:a9fe:a9fe", "IPv4-translated ::ffff:0:0:0/96"),
    ("64:ff9b::7f00:1", "NAT64 64:ff9b::/96 of 127.0.0.1"),
    ("64:ff9b::a9fe:a9fe", "NAT64 64:ff9b::/96 of 169.254.169.254"),
    ("64:ff9b::a00:1", "NAT64 64:ff9b::/96 of 10.0.0.1"),
    ("64:ff9b:1::7f00:1", "local-use NAT64 64:ff9b:1::/48"),
    ("64:ff9b:1:7f00:1::", "local-use NAT64 64:ff9b:1::/48 (a /64 embedding)"),
    ("2002:7f00:1::", "6to4 2002::/16 of 127.0.0.1"),
    ("2002:a9fe:a9fe::", "6to4 2002::/16 of 169.254.169.254"),
    ("2002:5db8:d70e::1", "6to4 2002::/16 (of a public address: deprecated, never needed)"),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo 2001::/32 (client 127.0.0.1)"),
    ("2001:0:5db8:d70e::1", "Teredo 2001::/32"),
]

REFUSED = SPECIAL_V4 + SPECIAL_V6 + EMBEDDED
REFUSED_IDS = [f"{a} {why}" for a, why in REFUSED]

PUBLIC = [
    "93.184.215.14",
    "8.8.8.8",
    "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
    "2a00:1450:4001:82b::200e",
    "64:ff9b::5db8:d70e",  # NAT64 of 93.184.215.14: what an IPv6-only subnet's DNS64 answers
    "::ffff:93.184.215.14",
]


def literal_url(address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"https://{host}/hook"


def resolves_to(address: str) -> object:
    return lambda host, port: [address]


@pytest.mark.parametrize(("address", "why"), REFUSED, ids=REFUSED_IDS)
def test_every_special_address_is_refused_at_add_as_a_literal_and_as_a_name(address: str, why: str) -> None:
    assert not is_public(address), why
    with pytest.raises(InvalidWebhook) as literal:
        check_url(literal_url(address), allow_private=False)
    assert literal.value.field == "url" and "not public" in literal.value.rule
    with pytest.raises(InvalidWebhook) as named:
        check_url("https://hooks.example.com/x", allow_private=False, resolver=resolves_to(address))  # type: ignore[arg-type]
    assert "not public" in named.value.rule


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_and_their_ipv6_forms_are_taken(address: str) -> None:
    assert is_public(address)
    assert check_url(literal_url(address), allow_private=False) == literal_url(address)


class Answers(AbstractResolver):
    """Stands in for the system's resolver (no DNS here): answers one address for any name."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.asked = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked += 1
        fam = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        return [ResolveResult(hostname=host, host=self.address, port=port, family=fam, proto=0, flags=0)]

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(("address", "why"), REFUSED, ids=REFUSED_IDS)
async def test_every_special_address_is_refused_at_delivery(address: str, why: str) -> None:
    settings = load_settings(webhook={"allow_private": False})
    # A name: the resolver refuses what it answers, before any connection.
    resolver = PublicResolver(False, inner=Answers(address))
    with pytest.raises(AddressNotPublic):
        await resolver.resolve("hooks.example.com", 443)
    # A literal: refused before anything is sent (nothing listens there in this test).
    poster = Poster(settings)
    try:
        answer = await poster.post(literal_url(address), {}, "{}")
    finally:
        await poster.close()
    assert (answer.result, answer.status) == ("blocked", None), why
    assert answer.error is not None and "not public" in answer.error


async def test_the_resolver_passes_public_answers_through() -> None:
    for address in PUBLIC:
        found = await PublicResolver(False, inner=Answers(address)).resolve("hooks.example.com", 443)
        assert [r["host"] for r in found] == [address]


def test_the_table_covers_each_registry_entry() -> None:
    # Each network of the module's table has an address of the test's table inside it:
    # a range added there is added here too.
    from fairpost.mailer.sdk.outcomes.special import NOT_PUBLIC

    tested = [ipaddress.ip_address(a) for a, _ in REFUSED]
    for network in NOT_PUBLIC:
        assert any(a.version == network.version and a in network for a in tested), network


async def test_enable_and_replay_refuse_an_endpoint_whose_url_is_not_public_any_more(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    # Added while private addresses were allowed, or written to Redis by someone else.
    hook = endpoint(hook_settings(redis_url), receiver, "acme", "/x")
    await aredis.hset(KEYS.webhook_endpoint(hook), "url", "https://[64:ff9b::a9fe:a9fe]/x")
    strict = load_settings(redis_url=redis_url)
    with Webhooks(strict) as hooks:
        hooks.disable(hook)
        for act in (lambda: hooks.enable(hook), lambda: hooks.replay(hook, datetime(2025, 1, 1, tzinfo=UTC))):
            with pytest.raises(InvalidWebhook) as raised:
                act()
            assert raised.value.field == "url" and "not public" in raised.value.rule
        assert not hooks.get(hook).enabled


async def test_the_client_resolves_a_name_again_after_its_dns_cache_expires(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An endpoint behind a load balancer changes addresses: a name is resolved again
    # (and checked again) once its cached answer is older than DNS_CACHE_SECONDS.
    monkeypatch.setattr(post, "DNS_CACHE_SECONDS", 1)
    answers = Answers("127.0.0.1")
    poster = Poster(hook_settings("redis://unused"), inner=answers)
    url = receiver.url("/dns").replace("127.0.0.1", "hooks.test")
    try:

        async def asked_again() -> bool:
            answer = await poster.post(url, {"Connection": "close"}, "{}")
            assert answer.result == "delivered", answer
            return answers.asked >= 2

        await wait_for_async(asked_again, within=10, what="the name resolved a second time")
    finally:
        await poster.close()


async def test_with_private_addresses_allowed_an_answer_is_kept_as_its_length_and_hash(
    receiver: Receiver,
) -> None:
    # Inside the cluster an answer's text could be a private service's: storing it would
    # turn a blind SSRF into a read. Its status, length and digest say enough.
    poster = Poster(hook_settings("redis://unused"))
    try:
        answer = await poster.post(receiver.url("/inside"), {}, "{}")
    finally:
        await poster.close()
    body = json.dumps({"ok": True}).encode()
    assert (answer.result, answer.status, answer.response) == ("delivered", 200, None)
    assert answer.response_bytes == len(body)
    assert answer.response_sha256 == hashlib.sha256(body).hexdigest()
