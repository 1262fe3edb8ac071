"""Reputation end to end: SES events (SNS and EventBridge wrapped, through a real SQS
queue on moto) → suppression lists, bounce and complaint rates, the guard; and
SES's own verdict on an SES tenant, read with GetReputationEntity.

SES is the recording server of tests/support (its tenants, reputation entities and
mailbox simulator: mailer/testing/ses_tenancy.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from functools import partial

import boto3
import pytest
import redis
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.config import Settings
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.ses_events import parse_event
from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.reputation import GuardState
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.suppression import Suppressions
from fairpost.mailer.testing.ses_publishing import EventSink, ses_event, wrap
from fairpost.mailer.testing.ses_server import SentMail, SesServer
from fairpost.mailer.testing.wait import wait_for_async as wait_for
from tests.support import SQS_BATCH, overtaken_by
from tests.support.pipeline import pipeline, quick_settings

EVENTS_QUEUE = "fairpost-events"
COMPLAINER = "complaint@simulator.amazonses.com"


@pytest.fixture(params=["sns", "eventbridge"])
def events(request: pytest.FixtureRequest, ses_env: SesServer, redis_url: str) -> Iterator[EventSink]:
    """SES publishes its events to the events queue, wrapped as SNS or EventBridge deliver them."""
    sqs = boto3.client("sqs")
    url, _ = init_events_queue(sqs, quick_settings(redis_url, events_queue_name=EVENTS_QUEUE))
    sink = EventSink(sqs, url, envelope=request.param)
    ses_env.events = sink
    yield sink
    sink.close()


def mail_to(address: str, subject: str = "hi") -> dict[str, object]:
    return {"sender": "app@example.com", "to": [address], "subject": subject, "text": "hello"}


async def state_of(client: AsyncMailClient, job_id: str) -> str:
    return (await client.status(job_id)).state


# -- the events' bodies ------------------------------------------------------------------


def recorded(tags: dict[str, str] | None = None) -> SentMail:
    return SentMail(
        message_id="0100abc-1", from_address="app@example.com", to=("a@example.org",), tags=tags or {}
    )


@pytest.mark.parametrize("envelope", ["sns", "raw", "eventbridge"])
def test_every_envelope_aws_documents_reads_as_the_same_event(envelope: str) -> None:
    mail = recorded({"fairpost-job-id": "j1", "fairpost-tenant": "acme"})
    event = parse_event(wrap(ses_event("Bounce", mail, ["a@example.org"]), envelope))  # type: ignore[arg-type]
    assert (event.kind, event.message_id, event.bounce_type, event.job_id, event.tenant) == (
        "bounce",
        "0100abc-1",
        "Permanent",
        "j1",
        "acme",
    )
    assert event.recipients == ("a@example.org",)
    assert event.diagnostic is not None and "a@example.org" not in event.diagnostic


@pytest.mark.parametrize(
    "body",
    ["not json", "[1]", '{"Type": "Notification", "Message": "{broken"}', '{"eventType": "Bounce"}',
     json.dumps({"version": "0", "id": "x", "detail-type": "Created", "source": "aws.s3", "detail": {}})],
)  # fmt: skip
def test_a_body_that_is_no_ses_event_is_refused_with_a_reason(body: str) -> None:
    with pytest.raises(ValueError):
        parse_event(body)


# -- suppression ---------------------------------------------------------------------------


async def test_a_complained_address_is_never_sent_again_by_that_tenant_but_still_is_by_another(
    redis_url: str, ses_env: SesServer, events: EventSink
) -> None:
    # One complaint in 200 sends would pause the tenant (0.5 % > 0.08 %): here only suppression is tested.
    settings = quick_settings(
        redis_url, events_queue_name=EVENTS_QUEUE, reputation={"complaint_threshold": 0.5}
    )
    async with pipeline(settings, reputation=True) as run, AsyncMailClient(settings) as client:
        first = await client.send("acme", **mail_to(COMPLAINER))  # type: ignore[arg-type]
        await wait_for(
            lambda: _suppressed(settings, "acme", COMPLAINER),
            within=20,
            what="the complaint to suppress the address",
        )
        await wait_for(
            lambda: _delivery(client, first, "complained"), within=10, what="the job to say complained"
        )
        again = await client.send("acme", **mail_to(COMPLAINER, "again"))  # type: ignore[arg-type]
        other = await client.send("globex", **mail_to(COMPLAINER, "other"))  # type: ignore[arg-type]
        await wait_for(
            lambda: _state(client, again, "suppressed"), within=15, what="acme's second mail suppressed"
        )
        await wait_for(lambda: _state(client, other, "sent"), within=15, what="globex's mail sent")
        assert run.reputation is not None and run.reputation.events is not None
        handled = run.reputation.events.handled
        await wait_for(lambda: handled.get("complaint", 0) >= 1, within=10, what="the complaint counted")
    sent_jobs = [m.job_id for m in ses_env.sent]
    assert first in sent_jobs and other in sent_jobs and again not in sent_jobs
    with Suppressions(settings) as lists:
        assert [e.reason for e in lists.list("acme")] == ["complaint"]


async def test_a_mail_with_some_recipients_suppressed_goes_to_the_rest(
    redis_url: str, ses_env: SesServer
) -> None:
    settings = quick_settings(redis_url)
    with Suppressions(settings) as lists:
        lists.add("acme", "Gone@Example.org")
    async with pipeline(settings, reputation=True), AsyncMailClient(settings) as client:
        job = await client.send(
            "acme",
            sender="app@example.com",
            to=["gone@example.org", "ada@example.org"],
            subject="s",
            text="t",
        )
        await wait_for(lambda: _state(client, job, "sent"), within=15, what="the mail sent")
        assert (await client.status(job)).suppressed == 1
    assert ses_env.sent[0].recipients == ("ada@example.org",)


async def test_unreadable_and_unmatched_events_are_counted_and_never_block_the_queue(
    redis_url: str, ses_env: SesServer, events: EventSink
) -> None:
    settings = quick_settings(redis_url, events_queue_name=EVENTS_QUEUE, reputation={"bounce_threshold": 0.5})
    async with pipeline(settings, reputation=True) as run, AsyncMailClient(settings) as client:
        events.emit_body("this is not an event")
        events.emit(ses_event("Bounce", recorded(), ["x@example.org"]))  # no such mail
        job = await client.send("acme", **mail_to("bounce@simulator.amazonses.com"))  # type: ignore[arg-type]
        assert run.reputation is not None and run.reputation.events is not None
        handled = run.reputation.events.handled
        await wait_for(lambda: handled.get("bounce") == 1, within=20, what="the bounce after the junk")
        assert (handled.get("unparseable"), handled.get("unmatched"), handled.get("bounce")) == (1, 1, 1)
        status = await client.status(job)
        assert status.bounce_type == "Permanent" and status.diagnostic and "@" not in status.diagnostic
        # SQS delivers at least once: the same event twice is acted on once.
        again = ses_event("Complaint", ses_env.sent[0], ["bounce@simulator.amazonses.com"])
        events.emit(again)
        events.emit(again)
        await wait_for(lambda: handled.get("duplicate") == 1, within=20, what="the repeated event")
        assert handled.get("complaint") == 1


# -- the guard -------------------------------------------------------------------------------


async def test_a_tenant_whose_list_bounces_ten_percent_is_paused_while_four_others_keep_their_latency(
    redis_url: str, ses_env: SesServer, events: EventSink
) -> None:
    settings = quick_settings(
        redis_url,
        events_queue_name=EVENTS_QUEUE,
        tenants={"bouncy": {"limits": "20/second"}},
        tenant_limits="20/second",
        reputation={"throttle_limits": "10/second"},
    )
    others = [f"good{i}" for i in range(4)]
    async with pipeline(settings, reputation=True), AsyncMailClient(settings) as client:
        # One bad address in ten, each a distinct one (suppression cannot help).
        bad = [
            mail_to(f"bounce+{i}@simulator.amazonses.com" if i % 10 == 9 else f"user{i}@example.org", f"b{i}")
            for i in range(400)
        ]
        bouncy = await client.send_many("bouncy", bad)
        overtaken: list[int] = []
        """For each of the others' mails: bouncy's mails SES got while it waited."""
        deadline = time.monotonic() + 60
        while not _paused(settings, "bouncy") and time.monotonic() < deadline:
            for tenant in others:
                since = len(ses_env.sent)
                job = await client.send(tenant, **mail_to("ok@example.org"))  # type: ignore[arg-type]
                await wait_for(partial(_state, client, job, "sent"), within=10, what=f"{tenant}'s mail")
                overtaken.append(overtaken_by(ses_env.sent, "bouncy", since, job))
        state = _guard(settings, "bouncy")
        assert state is not None and state.level == "paused", state
        # Paused before its bounce rate over its last 200 sends passed the threshold by more than one mail.
        sent = [m for m in ses_env.sent if m.tag("fairpost-tenant") == "bouncy"]
        last = sent[-200:]
        bounced = sum(1 for m in last if m.to[0].startswith("bounce+"))
        assert bounced <= 0.04 * 200 + 1, (bounced, len(sent))
        # It stays paused: nothing more of it goes out; its backlog waits.
        count = len(sent)
        for tenant in others:  # the others still flow, at their latency
            job = await client.send(tenant, **mail_to("ok@example.org"))  # type: ignore[arg-type]
            await wait_for(partial(_state, client, job, "sent"), within=10, what=f"{tenant}'s mail")
        assert len([m for m in ses_env.sent if m.tag("fairpost-tenant") == "bouncy"]) <= count + 1
        assert not all([await state_of(client, j) == "sent" for j in bouncy])
        # The others never wait behind bouncy's backlog: what overtakes them is at most
        # what bouncy had in flight already (its cap) and one receive's batch.
        assert max(overtaken) <= settings.inflight_cap_for("bouncy") + SQS_BATCH, overtaken
        async with redis.asyncio.Redis.from_url(settings.redis_url) as r:
            stats = await collect_stats(r, MailKeys(settings.key_prefix), settings)
        scope = stats.tenant("bouncy")
        assert scope is not None and scope.held == "reputation_paused"
        assert scope.reputation is not None and scope.reputation.windows[0].bounces >= 1
        # /metrics: the hold, and the rate against the sends.
        metrics = Metrics()
        metrics.update(stats)
        scraped = metrics.render().decode()
        assert (
            'fairpost_tenant_held{pool="default",reason="reputation_paused",tenant="bouncy"} 1.0' in scraped
        )
        assert 'fairpost_tenant_held{pool="default",reason="reputation_paused",tenant="good0"} 0.0' in scraped
        assert re.search(
            r'fairpost_tenant_bounce_rate\{pool="default",tenant="bouncy",window="24h"\} 0\.\d*[1-9]', scraped
        )
        # An operator's resume lifts it; the guard then judges only what comes after.
        with QuotaAdmin(settings) as admin:
            assert admin.resume("bouncy")
        assert _guard(settings, "bouncy") is None


def _paused(settings: Settings, tenant: str) -> bool:
    state = _guard(settings, tenant)
    return state is not None and state.level == "paused"


def _guard(settings: Settings, tenant: str) -> GuardState | None:
    with redis.Redis.from_url(settings.redis_url) as client:
        return GuardState.from_json(client.hget(MailKeys(settings.key_prefix).guard(), tenant))


def _suppressed(settings: Settings, tenant: str, address: str) -> bool:
    with Suppressions(settings) as lists:
        return lists.is_suppressed(tenant, address)


async def _state(client: AsyncMailClient, job_id: str, state: str) -> bool:
    return (await client.status(job_id)).state == state


async def _delivery(client: AsyncMailClient, job_id: str, delivery: str) -> bool:
    return (await client.status(job_id)).delivery == delivery


async def test_a_reputation_count_that_fails_leaves_the_mail_recorded_and_sent_once(
    redis_url: str, ses_env: SesServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The count rides last in the record's pipeline (fairpost.mailer.daemon.answers): its
    # error is logged, not raised, and the record does not wait on it.
    settings = quick_settings(redis_url)
    async with pipeline(settings, reputation=True) as run, AsyncMailClient(settings) as client:
        assert run.reputation is not None
        failing = run.store.redis.register_script("return redis.error_reply('ERR not counted (a test)')")
        run.reputation.book._script = failing
        job_id = await client.send("acme", **mail_to("a@example.org"))  # type: ignore[arg-type]

        async def sent() -> bool:
            return await state_of(client, job_id) == "sent"

        await wait_for(sent, within=10, what="the mail recorded sent")
    assert any("sends not counted for reputation" in r.getMessage() for r in caplog.records)
    assert [m.job_id for m in ses_env.sent] == [job_id]
