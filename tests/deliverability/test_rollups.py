"""Deliverability by mailbox provider, from outside: mail sent through the real
pipeline (SQS on moto, fairpost's SES emulator), SES events played onto the
events queue (SNS-wrapped, on moto), and the counts read back through the SDK's
admin API, ``fairpost analytics`` and the daemon's metrics. MX records come
from a local fake (conftest): there is no DNS here."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.config import Settings
from fairpost.mailer.cli import main
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.rollups import Deliverability, Report, RollupWriter
from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async as wait_for
from tests.support.deliverability import EVENTS_QUEUE, FakeDns
from tests.support.pipeline import pipeline, quick_settings

GMAIL = ["ann@gmail.com", "bob@gmail.com", "cy@workspace.example"]  # the last: Google Workspace
OUTLOOK = ["dee@outlook.com", "eve@m365.example"]  # the last: Microsoft 365


def mail_to(address: str) -> dict[str, Any]:
    return {"sender": "app@example.com", "to": [address], "subject": "hi", "text": "hello"}


def report(settings: Settings, tenant: str = "acme") -> Report:
    with Deliverability(settings) as book:
        return book.report(tenant, days=14)


def counts(settings: Settings, provider: str) -> dict[str, int]:
    found = {p.provider: p for p in report(settings).providers}
    return found[provider].counts if provider in found else {}


async def test_gmail_recipients_bouncing_while_outlooks_are_delivered_shows_by_provider(
    redis_url: str, ses_env: SesServer, events: EventSink, fake_dns: FakeDns,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # The guard would pause acme at these bounce rates: here only the counting is tested.
    settings = quick_settings(
        redis_url, events_queue_name=EVENTS_QUEUE, reputation={"bounce_threshold": 1, "min_sends": 1000}
    )
    async with (
        pipeline(settings, reputation=True, mx_lookup=fake_dns) as run,
        AsyncMailClient(settings) as client,
    ):
        jobs = {a: await client.send("acme", **mail_to(a)) for a in GMAIL + OUTLOOK}
        await wait_for(lambda: _all_sent(ses_env, len(jobs)), within=20, what="every mail at SES")
        by_address = {m.recipients[0]: m.message_id for m in ses_env.sent}
        for address in GMAIL:
            ses_env.emit("Bounce", by_address[address])
        for address in OUTLOOK:
            ses_env.emit("Delivery", by_address[address])
        ses_env.emit("Complaint", by_address["dee@outlook.com"])
        await wait_for(
            lambda: _is(settings, "outlook", "complained", 1), within=20, what="the events counted"
        )
        await wait_for(lambda: _is(settings, "gmail", "hard_bounced", 3), within=20, what="the bounces")
        assert run.metrics is not None
        metrics = run.metrics.render().decode()

    gmail, outlook = counts(settings, "gmail"), counts(settings, "outlook")
    assert (gmail["sent"], gmail["hard_bounced"], gmail["delivered"]) == (3, 3, 0)
    assert [outlook[c] for c in ("sent", "delivered", "hard_bounced", "complained")] == [2, 2, 0, 1]
    totals = {p.provider: p for p in report(settings).providers}
    assert totals["gmail"].bounce_rate.text() == "100.00% (3 hard bounces / 3 sent)"
    assert totals["outlook"].bounce_rate.text() == "0.00% (0 hard bounces / 2 sent)"
    # Gmail sends no complaint reports: its complaint rate is unknown, not 0 %.
    assert totals["gmail"].complaint_rate.value is None and totals["gmail"].complaint_rate.no_data
    assert totals["outlook"].complaint_rate.text() == "50.00% (1 complaints / 2 delivered)"

    assert 'fairpost_deliverability_total{outcome="hard_bounced",provider="gmail"} 3.0' in metrics
    assert 'fairpost_deliverability_total{outcome="delivered",provider="outlook"} 2.0' in metrics
    assert 'fairpost_deliverability_total{outcome="sent",provider="gmail"} 3.0' in metrics
    assert "fairpost_deliverability_tenant_total{" not in metrics  # tenant labels: off by default

    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    assert main(["analytics", "acme", "--days", "3"]) == 0
    out = capsys.readouterr().out
    assert "gmail: bounce rate 100.00% (3 hard bounces / 3 sent); complaint rate no data" in out
    assert "outlook: bounce rate 0.00% (0 hard bounces / 2 sent); complaint rate 50.00%" in out
    assert main(["analytics", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (acme,) = data["tenants"]
    rows = {p["provider"]: p for p in acme["providers"]}
    assert rows["gmail"]["complaint_rate"] == {
        "value": None, "numerator": 0, "denominator": 0, "of": "complaints", "per": "delivered",
        "no_data": True,
    }  # fmt: skip
    assert rows["outlook"]["bounce_rate"]["value"] == 0.0 and rows["gmail"]["hard_bounced"] == 3


async def test_a_suppressed_recipient_is_counted_at_its_provider(
    redis_url: str, ses_env: SesServer, fake_dns: FakeDns
) -> None:
    settings = quick_settings(redis_url)
    with Deliverability(settings) as book, _suppressions(settings) as lists:
        lists.add("acme", "cy@workspace.example")
        async with pipeline(settings, reputation=True, mx_lookup=fake_dns), AsyncMailClient(settings) as c:
            job = await c.send("acme", **mail_to("cy@workspace.example"))
            await wait_for(lambda: _state(c, job, "suppressed"), within=20, what="the mail suppressed")
            await wait_for(lambda: _is(settings, "gmail", "suppressed", 1), within=10, what="it counted")
        assert book.report("acme", days=1).providers[0].counts["sent"] == 0


async def test_one_call_counts_a_group_and_keeps_the_minute_history_bounded(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis, settings: Settings
) -> None:
    keys = MailKeys(settings.key_prefix)
    writer = RollupWriter(aredis, keys, settings)
    # 70 minutes of one send each, as if: the slots of minutes older than the hour start again.
    history = keys.send_history("t:acme")
    now_minute = int(redis_client.time()[0]) // 60
    for minute in range(now_minute - 70, now_minute):
        redis_client.hset(history, str(minute % 60), f"{minute}:1")
    async with aredis.pipeline(transaction=False) as pipe:
        await writer.queue(pipe, "acme", {("gmail", "sent"): 3, ("other", "sent"): 1}, sent_now=4)
        replies = await pipe.execute()
    assert len(replies) == 1  # one script call, whatever the providers
    with Deliverability(settings, redis_client=redis_client) as book:
        minutes = book.send_history("acme").minutes
        everyone = book.send_history().minutes
        day = book.report("acme", days=1)
    assert len(minutes) == 60 and redis_client.hlen(history) == 60
    if minutes[-1][0] == now_minute * 60_000:  # (the minute may have turned meanwhile)
        assert minutes[-1][1] == 4 and sum(c for _, c in minutes) == 59 + 4
    assert sum(c for _, c in everyone) == 4
    assert {p.provider: p.counts["sent"] for p in day.providers} == {"gmail": 3, "other": 1}
    ttl = redis_client.ttl(keys.rollup_prefix("acme") + str(int(redis_client.time()[0]) // 86400))
    assert 0 < ttl <= settings.deliverability.retention_days * 86400


def _all_sent(ses: SesServer, n: int) -> bool:
    return len(ses.sent) >= n


def _is(settings: Settings, provider: str, counter: str, n: int) -> bool:
    return counts(settings, provider).get(counter, 0) >= n


async def _state(client: AsyncMailClient, job_id: str, state: str) -> bool:
    return (await client.status(job_id)).state == state


def _suppressions(settings: Settings) -> Any:
    from fairpost.mailer.sdk.suppression import Suppressions

    return Suppressions(settings)


def test_an_unsubscribe_recorded_outside_the_daemon_is_counted_at_its_provider(
    redis_client: redis.Redis, settings: Settings
) -> None:
    with Deliverability(settings, redis_client=redis_client) as book:
        assert book.count("acme", "recipient.unsubscribed", ["Ann <ann@Gmail.com>", "x@corp.example"]) == 2
        assert book.count("acme", "mail.delayed", ["ann@gmail.com"]) == 0  # feeds no counter
        rows = {p.provider: p.counts for p in book.report("acme", days=1).providers}
    assert (rows["gmail"]["unsubscribed"], rows["other"]["unsubscribed"]) == (1, 1)
    assert sum(rows["gmail"].values()) == 1


def test_a_tenant_label_only_behind_its_setting(settings: Settings) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from fairpost.mailer.daemon.deliverability import DeliverabilityMetrics

    registry = CollectorRegistry()
    metrics = DeliverabilityMetrics(registry)
    metrics.observe({("gmail", "sent"): 2})
    metrics.observe({("gmail", "sent"): 1}, "acme")
    text = generate_latest(registry).decode()
    assert 'fairpost_deliverability_total{outcome="sent",provider="gmail"} 3.0' in text
    assert 'fairpost_deliverability_tenant_total{outcome="sent",provider="gmail",tenant="acme"} 1.0' in text
