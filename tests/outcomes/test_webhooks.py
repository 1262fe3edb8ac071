"""Signed webhook deliveries: per tenant, in order per job, retried on the schedule,
disabled on 410, fair between tenants, once at a time over replicas.

A real redis-server, the daemon's webhook tasks (fan-out and deliveries) in the
test's event loop, and a local receiver that verifies every delivery with the
``standardwebhooks`` package (tests/outcomes/receiver.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.calls import outcome_journal
from fairpost.dispatcher.journal import JournalWriter
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.conftest import delivering, hook_settings
from tests.outcomes.receiver import Answer, Receiver
from tests.outcomes.support import feed_of

KEYS = MailKeys()
LIFE = (feed.SENT, feed.DELIVERED, feed.BOUNCED)


async def write(
    settings: Settings, client: redis.asyncio.Redis, tenant: str, job_id: str, *types: str
) -> None:
    """Events of one job, in this order (as the daemon appends them)."""
    await client.hset(KEYS.job(job_id), mapping={"tenant": tenant, "state": "sent"})
    journal = JournalWriter(client, outcome_journal(settings))
    for kind in types:
        await journal.append(KEYS.job(job_id), job_id, feed.entry(kind, {"ses_message_id": f"ses-{job_id}"}))


def endpoint(settings: Settings, receiver: Receiver, tenant: str, path: str, **options: Any) -> str:
    with Webhooks(settings) as hooks:
        made = hooks.add(tenant, receiver.url(path), **options)
    receiver.secret(path, made.secret)
    return made.id


def order_per_job(receiver: Receiver, path: str) -> dict[str, list[str]]:
    jobs: dict[str, list[str]] = {}
    for d in receiver.verified(path):
        assert d.event is not None
        jobs.setdefault(d.event["data"]["job_id"], []).append(d.event["type"])
    return jobs


async def test_each_tenant_gets_every_event_of_its_jobs_signed_in_order_and_no_other(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    endpoint(settings, receiver, "acme", "/acme")
    endpoint(settings, receiver, "globex", "/globex")
    for i in range(20):
        await write(settings, aredis, "acme", f"a{i}", *LIFE)
        await write(settings, aredis, "globex", f"g{i}", feed.SENT, feed.DELIVERED)
    async with delivering(settings, replicas=2):
        await wait_for_async(lambda: len(receiver.at("/acme")) >= 60, within=20, what="acme's 60 events")
        await wait_for_async(lambda: len(receiver.at("/globex")) >= 40, within=20, what="globex's 40 events")
    events = {e.id: e for e in await feed_of(aredis, KEYS)}
    for path, tenant, count in (("/acme", "acme", 60), ("/globex", "globex", 40)):
        got = receiver.at(path)
        assert all(d.error is None for d in got), [d.error for d in got if d.error]
        assert sorted({d.event_id for d in got}) == sorted(i for i, e in events.items() if e.tenant == tenant)
        assert len(got) == count  # every 2xx ends a delivery: none twice
        for d in got:
            # The id is the event's, the body its documented body, byte for byte.
            assert d.body == events[d.event_id].body()
            assert d.headers["webhook-signature"].startswith("v1,")
            assert d.headers["content-type"] == "application/json"
    assert {tuple(v) for v in order_per_job(receiver, "/acme").values()} == {LIFE}
    assert {tuple(v) for v in order_per_job(receiver, "/globex").values()} == {(feed.SENT, feed.DELIVERED)}


async def test_an_endpoint_gets_only_the_types_it_asked_for(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    endpoint(settings, receiver, "acme", "/bounces", events=[feed.BOUNCED])
    await write(settings, aredis, "acme", "j1", *LIFE)
    await write(settings, aredis, "acme", "j2", *LIFE)
    async with delivering(settings):
        await wait_for_async(lambda: len(receiver.at("/bounces")) >= 2, within=10, what="the bounces")
    assert [d.event["type"] for d in receiver.verified("/bounces") if d.event] == ["mail.bounced"] * 2


async def test_failures_are_retried_on_the_schedule_then_given_up_and_the_job_goes_on(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    settings = hook_settings(redis_url, retry_schedule="100ms,300ms")
    hook = endpoint(settings, receiver, "acme", "/down")
    receiver.plan("/down", Answer(500), Answer(502), Answer(503))
    await write(settings, aredis, "acme", "j1", feed.SENT, feed.DELIVERED)
    async with delivering(settings) as [part]:
        await wait_for_async(
            lambda: len(receiver.at("/down")) >= 4, within=20, what="3 attempts and the next event"
        )
    first, second, third, nxt = receiver.at("/down")
    assert first.event_id == second.event_id == third.event_id != nxt.event_id
    # Each wait is its step of the schedule, plus at most a tenth of it.
    assert second.at - first.at >= 0.1
    assert third.at - second.at >= 0.3
    # Given up after the schedule: only then does the job's next event go.
    assert nxt.event is not None and nxt.event["type"] == "mail.delivered" and nxt.at >= third.at
    with Webhooks(settings) as hooks:
        attempts = hooks.attempts(hook)
    assert [a["result"] for a in attempts] == ["delivered", "http_error", "http_error", "http_error"]
    assert [a["status"] for a in attempts] == [200, 503, 502, 500]
    assert attempts[1]["attempt"] == 3 and attempts[1]["next_attempt_in_seconds"] is None
    assert 0.3 <= attempts[2]["next_attempt_in_seconds"] <= 0.33
    counted = (
        part.metrics.attempts.labels("http_error")._value.get(),
        part.metrics.attempts.labels("delivered")._value.get(),
    )
    assert counted == (3, 1)
    assert part.metrics.deliveries.labels("given_up")._value.get() == 1
    # The warning says which endpoint gave up (its id: never its URL, which may hold a secret).
    [warning] = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert hook in warning and receiver.url("/down") not in warning


async def test_retry_after_is_honoured(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url, retry_schedule="50ms,5s")
    endpoint(settings, receiver, "acme", "/busy")
    receiver.plan("/busy", Answer(429, {"Retry-After": "1"}))
    await write(settings, aredis, "acme", "j1", feed.SENT)
    async with delivering(settings):
        await wait_for_async(lambda: len(receiver.verified("/busy")) >= 2, within=20, what="the retry")
    first, second = receiver.at("/busy")
    assert second.at - first.at >= 1.0  # not the 50 ms step: the endpoint asked for a second
    assert second.event_id == first.event_id


async def test_410_disables_the_endpoint_at_once_and_enable_delivers_what_waited(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    hook = endpoint(settings, receiver, "acme", "/gone")
    receiver.plan("/gone", Answer(410))
    await write(settings, aredis, "acme", "j1", feed.SENT, feed.DELIVERED)
    async with delivering(settings) as [part]:
        with Webhooks(settings) as hooks:
            await wait_for_async(lambda: not hooks.get(hook).enabled, within=10, what="the endpoint disabled")
            assert hooks.get(hook).disabled_reason == "gone"
            assert len(receiver.at("/gone")) == 1
            assert part.metrics.disabled.labels("gone")._value.get() == 1
            hooks.enable(hook)
        await wait_for_async(
            lambda: len(receiver.at("/gone")) >= 3, within=10, what="both events after enable"
        )
    assert [d.event["type"] for d in receiver.at("/gone")[1:] if d.event] == ["mail.sent", "mail.delivered"]
    assert receiver.at("/gone")[0].event_id == receiver.at("/gone")[1].event_id


async def test_an_endpoint_failing_for_disable_after_is_disabled(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url, retry_schedule="100ms,100ms,100ms,100ms", disable_after="250ms")
    hook = endpoint(settings, receiver, "acme", "/broken")
    receiver.plan("/broken", *[Answer(500)] * 10)
    await write(settings, aredis, "acme", "j1", feed.SENT)
    async with delivering(settings):
        with Webhooks(settings) as hooks:
            await wait_for_async(lambda: not hooks.get(hook).enabled, within=10, what="the endpoint disabled")
            assert hooks.get(hook).disabled_reason == "failing"
            assert hooks.get(hook).pending == 1  # the event waits for an operator
    assert 3 <= len(receiver.at("/broken")) <= 4


async def test_a_hanging_endpoint_does_not_delay_another_tenants_deliveries(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url, timeout_seconds=30, concurrency=8, endpoint_concurrency=4)
    endpoint(settings, receiver, "acme", "/hangs")
    endpoint(settings, receiver, "globex", "/fast")
    receiver.plan("/hangs", *[Answer(hang=True)] * 100)
    for i in range(30):
        await write(settings, aredis, "acme", f"a{i}", feed.SENT)
        await write(settings, aredis, "globex", f"g{i}", feed.SENT)
    async with delivering(settings):
        try:
            await wait_for_async(
                lambda: len(receiver.at("/fast")) >= 30, within=20, what="globex's deliveries"
            )
            # Every one of them while acme's endpoint still hangs on its first attempts,
            # which take no more than its cap of the process's slots.
            assert 1 <= len(receiver.at("/hangs")) <= 4
            assert receiver.hanging == len(receiver.at("/hangs"))
        finally:
            receiver.released.set()


async def test_replicas_never_deliver_one_event_twice_at_once(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    endpoint(settings, receiver, "acme", "/slow")
    receiver.plan("/slow", *[Answer(delay=0.05)] * 40)
    for i in range(40):
        await write(settings, aredis, "acme", f"j{i}", feed.SENT)
    async with delivering(settings, replicas=3):
        await wait_for_async(lambda: len(receiver.at("/slow")) >= 40, within=20, what="40 deliveries")
    assert len(receiver.at("/slow")) == 40
    assert set(receiver.most_at_once.values()) == {1}
    assert len({d.event_id for d in receiver.at("/slow")}) == 40


async def test_a_rotated_secret_and_the_previous_one_both_sign_during_the_overlap(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    with Webhooks(settings) as hooks:
        old = hooks.add("acme", receiver.url("/old"))
        new = hooks.rotate_secret(old.id)
    assert new.id == old.id and new.secret != old.secret and new.secret.startswith("whsec_")
    await write(settings, aredis, "acme", "j1", feed.SENT)
    async with delivering(settings):
        await wait_for_async(lambda: len(receiver.at("/old")) >= 1, within=10, what="the delivery")
    [delivery] = receiver.at("/old")
    signatures = delivery.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2
    for secret in (old.secret, new.secret):
        receiver.secret("/check", secret)
        assert receiver._verify("/check", delivery.body, delivery.headers)[0] is not None


async def test_past_the_overlap_only_the_new_secret_signs(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url, rotation_overlap="0s")
    with Webhooks(settings) as hooks:
        old = hooks.add("acme", receiver.url("/new"))
        new = hooks.rotate_secret(old.id)
    receiver.secret("/new", new.secret)
    await write(settings, aredis, "acme", "j1", feed.SENT)
    async with delivering(settings):
        await wait_for_async(lambda: len(receiver.verified("/new")) >= 1, within=10, what="the delivery")
    [delivery] = receiver.at("/new")
    assert len(delivery.headers["webhook-signature"].split(" ")) == 1
    receiver.secret("/check", old.secret)
    assert receiver._verify("/check", delivery.body, delivery.headers)[0] is None


async def test_replay_sends_past_events_again_with_their_original_ids(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    hook = endpoint(settings, receiver, "acme", "/replay", events=[feed.SENT, feed.BOUNCED])
    await write(settings, aredis, "acme", "j1", *LIFE)
    await write(settings, aredis, "globex", "g1", *LIFE)
    async with delivering(settings):
        await wait_for_async(lambda: len(receiver.at("/replay")) >= 2, within=10, what="the first deliveries")
        first = [d.event_id for d in receiver.at("/replay")]
        since = (await feed_of(aredis, KEYS))[0].timestamp
        with Webhooks(settings) as hooks:
            assert hooks.replay(hook, since=since) == 2  # acme's sent and bounced, not globex's
        await wait_for_async(lambda: len(receiver.at("/replay")) >= 4, within=10, what="the replayed ones")
    assert [d.event_id for d in receiver.at("/replay")[2:]] == first


async def test_a_timeout_is_retried_and_the_retry_delivers(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url, timeout_seconds=0.5, retry_schedule="50ms")
    hook = endpoint(settings, receiver, "acme", "/sleepy")
    receiver.plan("/sleepy", Answer(hang=True))
    await write(settings, aredis, "acme", "j1", feed.SENT)
    async with delivering(settings):
        await wait_for_async(lambda: len(receiver.at("/sleepy")) >= 2, within=10, what="the retry")
        with Webhooks(settings) as hooks:
            await wait_for_async(lambda: len(hooks.attempts(hook)) >= 2, within=10, what="two attempts")
            results = [a["result"] for a in hooks.attempts(hook)]
    assert results == ["delivered", "timeout"]
    first, second = receiver.at("/sleepy")
    assert first.event_id == second.event_id and second.at - first.at >= 0.5
