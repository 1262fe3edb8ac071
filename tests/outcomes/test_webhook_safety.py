"""Webhooks safe by default: no URL that reaches the cluster's own services, checked
at ``add`` and again at each delivery; a delivery whose replica died is delivered
by another, never lost; bad input refused naming the field."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from fairpost.config import load_settings
from fairpost.mailer.daemon.webhooks.loop import WebhookDeliveries
from fairpost.mailer.daemon.webhooks.metrics import WebhookMetrics
from fairpost.mailer.errors import InvalidWebhook, UnknownEndpoint
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.outcomes.deliveries import DeliveryCalls, claimed, script
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.sdk.outcomes.urls import check_url, is_public
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.conftest import delivering, hook_settings
from tests.outcomes.receiver import Receiver
from tests.outcomes.test_webhooks import endpoint, write

KEYS = MailKeys()


def resolves_to(*addresses: str) -> Callable[[str, int], list[str]]:
    return lambda host, port: list(addresses)


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
     "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1", "not an ip"],
)  # fmt: skip
def test_private_loopback_link_local_and_mapped_addresses_are_not_public(address: str) -> None:
    assert not is_public(address)


def test_public_addresses_are() -> None:
    assert is_public("93.184.215.14") and is_public("2606:2800:21f:cb07:6820:80da:af6b:8b2c")


@pytest.mark.parametrize(
    ("url", "resolved", "rule"),
    [
        ("http://hooks.example.com/x", ["93.184.215.14"], "must be https://"),
        ("https://127.0.0.1/x", ["127.0.0.1"], "public addresses only"),
        ("https://metadata.internal/x", ["169.254.169.254"], "public addresses only"),
        ("https://mixed.example.com/x", ["93.184.215.14", "10.0.0.7"], "public addresses only"),
        ("https://user:pw@hooks.example.com/x", ["93.184.215.14"], "no credentials"),
        ("https:///x", [], "must name a host"),
        ("ftp://hooks.example.com/x", ["93.184.215.14"], "must be https://"),
        ("https://hooks.example.com/x#frag", ["93.184.215.14"], "no fragment"),
    ],
)
def test_a_url_fairpost_may_not_call_is_refused_naming_the_rule(
    url: str, resolved: list[str], rule: str
) -> None:
    with pytest.raises(InvalidWebhook) as raised:
        check_url(url, allow_private=False, resolver=resolves_to(*resolved))
    assert raised.value.field == "url" and rule in raised.value.rule


def test_an_https_url_of_public_addresses_is_taken_and_allow_private_takes_http() -> None:
    url = "https://hooks.example.com/fairpost?t=1"
    assert check_url(url, allow_private=False, resolver=resolves_to("93.184.215.14")) == url
    assert (
        check_url("http://fairpost-receiver:8080/x", allow_private=True) == "http://fairpost-receiver:8080/x"
    )


def test_add_refuses_bad_input_and_writes_nothing(redis_url: str) -> None:
    settings = load_settings(redis_url=redis_url)  # the default: no private addresses
    with Webhooks(settings) as hooks:
        for args, kwargs, field in (
            (("acme", "http://127.0.0.1:9/x"), {}, "url"),
            (("acme", "https://localhost/x"), {}, "url"),
            (("no tenant!", "https://hooks.example.com/x"), {}, "tenant"),
            (("acme", "https://hooks.example.com/x"), {"events": ["mail.opened"]}, "events"),
        ):
            with pytest.raises(InvalidWebhook) as raised:
                hooks.add(*args, **kwargs)  # type: ignore[arg-type]
            assert raised.value.field == field
        assert hooks.list() == []
        with pytest.raises(UnknownEndpoint):
            hooks.rotate_secret("ep_nope")
        with pytest.raises(InvalidWebhook):
            hooks.replay("ep_nope", datetime(2025, 1, 1))  # naive: refused before anything


async def test_a_delivery_to_a_private_address_is_blocked_at_delivery_time(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    # Added while private addresses were allowed (or its name resolved elsewhere then):
    # a daemon that does not allow them does not call it.
    allowed = hook_settings(redis_url)
    hook = endpoint(allowed, receiver, "acme", "/inside")
    named = endpoint(allowed, receiver, "acme", "/named")
    # Over https, a name and an address: the resolver refuses what the name resolves
    # to (127.0.0.1), the address is checked as it is.
    by_name_url = receiver.url("/named").replace("http://127.0.0.1", "https://localhost")
    await aredis.hset(KEYS.webhook_endpoint(named), "url", by_name_url)
    await aredis.hset(KEYS.webhook_endpoint(hook), "url", receiver.url("/inside").replace("http:", "https:"))
    await write(allowed, aredis, "acme", "j1", feed.SENT)
    strict = hook_settings(redis_url, allow_private=False)
    async with delivering(strict):
        with Webhooks(strict) as hooks:
            await wait_for_async(lambda: len(hooks.attempts(hook)) >= 1, within=10, what="an attempt")
            await wait_for_async(lambda: len(hooks.attempts(named)) >= 1, within=10, what="an attempt")
            [by_ip] = hooks.attempts(hook)[-1:]
            [by_name] = hooks.attempts(named)[-1:]
    assert by_ip["result"] == by_name["result"] == "blocked"
    assert "not public" in by_name["error"] and "not public" in by_ip["error"]
    assert receiver.deliveries == []


async def test_a_delivery_whose_replica_died_is_delivered_by_another(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    endpoint(settings, receiver, "acme", "/after")
    await write(settings, aredis, "acme", "j1", feed.SENT)
    calls = DeliveryCalls(KEYS)
    # A replica fans the event out and claims it, then dies before its attempt.
    dying = WebhookDeliveries(aredis, KEYS, settings, WebhookMetrics(CollectorRegistry()))
    assert await dying.fanout_once() == 1
    keys, args = calls.claim(10, 4, 200, 16)  # a short lease
    [taken] = claimed(await aredis.register_script(script("claim"))(keys=keys, args=args))
    assert taken.tries == 0 and taken.tenant == "acme"
    async with delivering(settings):
        await wait_for_async(lambda: len(receiver.at("/after")) >= 1, within=10, what="the delivery")
    [delivery] = receiver.at("/after")
    assert delivery.event_id == taken.event_id and delivery.event is not None
