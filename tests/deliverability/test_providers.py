"""Which mailbox provider a domain is: its own name, or its MX hosts, cached with a TTL
and bounded; DNS away falls back to the name. The lookup is a local fake (conftest)."""

from __future__ import annotations

import asyncio

import pytest

from fairpost.config import load_settings
from fairpost.config.errors import ConfigError
from fairpost.mailer.daemon.mx import RETRY_SECONDS, ProviderMap
from tests.support.deliverability import FakeDns


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def providers(dns: FakeDns, clock: Clock | None = None, **conf: object) -> ProviderMap:
    settings = load_settings(deliverability=conf)
    return ProviderMap(settings, dns, clock=clock or Clock())


async def test_a_providers_own_domain_needs_no_lookup_and_a_hosted_domain_counts_as_its_provider(
    fake_dns: FakeDns,
) -> None:
    found = await providers(fake_dns).providers(
        ["gmail.com", "hotmail.com", "workspace.example", "m365.example", "self-hosted.example"]
    )
    assert found == {
        "gmail.com": "gmail",
        "hotmail.com": "outlook",
        "workspace.example": "gmail",
        "m365.example": "outlook",
        "self-hosted.example": "other",
    }
    assert sorted(fake_dns.asked) == ["m365.example", "self-hosted.example", "workspace.example"]


async def test_a_lookup_is_cached_for_its_ttl_then_asked_again(fake_dns: FakeDns) -> None:
    clock = Clock()
    book = providers(fake_dns, clock, mx_cache_seconds=600)
    await book.providers(["workspace.example"])
    await book.providers(["workspace.example"])
    assert fake_dns.asked == ["workspace.example"]
    clock.now += 601
    assert await book.providers(["workspace.example"]) == {"workspace.example": "gmail"}
    assert fake_dns.asked == ["workspace.example"] * 2


async def test_the_cache_keeps_at_most_its_size_the_least_recently_used_leaving(fake_dns: FakeDns) -> None:
    book = providers(fake_dns, mx_cache_size=2)
    await book.providers(["a.example"])
    await book.providers(["b.example"])
    await book.providers(["a.example"])  # used again: b is now the oldest
    await book.providers(["c.example"])
    assert book.known("a.example") == "other" and book.known("c.example") == "other"
    assert book.known("b.example") is None


async def test_with_dns_away_a_domain_counts_by_its_name_and_is_tried_again_later(fake_dns: FakeDns) -> None:
    clock = Clock()
    book = providers(fake_dns, clock)
    fake_dns.down = True
    found = await book.providers(["gmail.com", "workspace.example"])
    assert found == {"gmail.com": "gmail", "workspace.example": "other"}
    fake_dns.down = False
    await book.providers(["workspace.example"])
    assert fake_dns.asked == ["workspace.example"]  # not at every mail
    clock.now += RETRY_SECONDS + 1
    assert await book.providers(["workspace.example"]) == {"workspace.example": "gmail"}


async def test_a_lookup_slower_than_the_timeout_counts_the_domain_by_its_name() -> None:
    async def slow(domain: str, lifetime: float) -> list[str]:
        await asyncio.sleep(30)
        return ["aspmx.l.google.com"]

    book = ProviderMap(load_settings(deliverability={"mx_timeout_seconds": 0.05}), slow)
    assert await book.providers(["workspace.example"]) == {"workspace.example": "other"}


async def test_a_provider_not_named_in_the_settings_counts_as_other(fake_dns: FakeDns) -> None:
    book = providers(fake_dns, providers="outlook")
    found = await book.providers(["gmail.com", "workspace.example", "outlook.com"])
    assert found == {"gmail.com": "other", "workspace.example": "other", "outlook.com": "outlook"}


def test_an_unknown_provider_in_the_settings_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="gmial"):
        load_settings(deliverability={"providers": ["gmail", "gmial"]})
