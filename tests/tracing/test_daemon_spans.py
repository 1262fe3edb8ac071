"""The daemon's spans through a real pipeline (issue 30, item 3): one mail sent inside
the application's span is one trace, by links (or parenthood with
FAIRPOST_TRACE_PARENT), through the hand-off, the processing and the SES call;
quota waits are events; no address, subject or body in any span."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from fairpost import AsyncMailClient
from fairpost.config import Settings
from fairpost.mailer.daemon.parking import PRECISE_WAIT_MAX
from fairpost.mailer.daemon.tracing import Tracing
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings
from tests.tracing.conftest import named

pytestmark = pytest.mark.usefixtures("ses_env")

QUEUE = "fairpost-mail.fifo"
SECRETS = ("ada@example.org", "bob@example.org", "app@acme.example", "Reset your password", "the reset link")
MAIL: dict[str, Any] = {
    "sender": "app@acme.example",
    "to": ["ada@example.org"],
    "cc": ["bob@example.org"],
    "subject": "Reset your password",
    "text": "the reset link",
}


def ids(context: trace.SpanContext | None) -> tuple[int, int]:
    """A span context as it crosses the queue: its ids (a remote copy differs in is_remote)."""
    assert context is not None
    return context.trace_id, context.span_id


def waited_seconds(event: Event) -> float:
    value = dict(event.attributes or {})["fairpost.wait_seconds"]
    assert isinstance(value, float | int)
    return float(value)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def of_job(spans: InMemorySpanExporter, prefix: str, job_id: str) -> list[ReadableSpan]:
    return [s for s in named(spans, prefix) if attrs(s).get("fairpost.job_id") == job_id]


def ended(spans: InMemorySpanExporter, job_id: str, state: str) -> bool:
    return any(attrs(s).get("fairpost.state") == state for s in of_job(spans, "process ", job_id))


def strings(span: ReadableSpan) -> Iterator[str]:
    """Every text a span carries: its name, status, attributes, events' and links' attributes."""
    yield span.name
    yield span.status.description or ""
    for attributes in [
        span.attributes,
        *(e.attributes for e in span.events),
        *(link.attributes for link in span.links),
    ]:
        for key, value in (attributes or {}).items():
            yield key
            yield str(value)


def assert_no_mail_in(spans: InMemorySpanExporter) -> None:
    finished = spans.get_finished_spans()
    assert finished
    leaked = {(s.name, text) for s in finished for text in strings(s) if any(x in text for x in SECRETS)}
    assert leaked == set()


async def send_in_span(
    settings: Settings, app_tracer: trace.Tracer, **options: Any
) -> tuple[str, trace.Span]:
    async with AsyncMailClient(settings) as client:
        with app_tracer.start_as_current_span("POST /password-reset") as app:
            job_id = await client.send("acme", **{**MAIL, **options})
    return job_id, app


async def test_one_mail_is_one_trace_from_the_application_to_ses(
    redis_url: str, ses: SesServer, spans: InMemorySpanExporter, app_tracer: trace.Tracer, tracing: Tracing
) -> None:
    settings = quick_settings(redis_url)
    async with pipeline(settings, tracing=tracing):
        job_id, app = await send_in_span(settings, app_tracer, priority="high")
        await wait_for_async(
            lambda: ended(spans, job_id, "sent"), within=15, what="the mail's processing span"
        )
    [create] = of_job(spans, "create ", job_id)
    assert create.parent is not None and create.parent.span_id == app.get_span_context().span_id
    assert create.context is not None

    [handoff] = named(spans, "send ")
    assert handoff.name == f"send {QUEUE}" and handoff.kind is SpanKind.PRODUCER
    assert attrs(handoff) == {
        "messaging.system": "aws_sqs",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": QUEUE,
        "messaging.batch.message_count": 1,
        "fairpost.handed_off": 1,
    }
    [link] = handoff.links
    assert ids(link.context) == ids(create.context)
    assert dict(link.attributes or {}) == {"fairpost.job_id": job_id, "fairpost.tenant_id": "acme"}

    [process] = of_job(spans, "process ", job_id)
    assert process.name == f"process {QUEUE}" and process.kind is SpanKind.CONSUMER
    assert process.parent is None  # linked, not parented, by default
    assert [ids(link.context) for link in process.links] == [ids(create.context)]
    assert attrs(process) | {"messaging.message.id": "-"} == {
        "messaging.system": "aws_sqs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": QUEUE,
        "messaging.message.id": "-",
        "fairpost.job_id": job_id,
        "fairpost.tenant_id": "acme",
        "fairpost.priority": "high",
        "fairpost.recipients": 2,
        "fairpost.state": "sent",
    }
    assert attrs(process)["messaging.message.id"]

    [call] = of_job(spans, "SESv2.", job_id)
    assert call.name == "SESv2.SendEmail" and call.kind is SpanKind.CLIENT
    assert process.context is not None and call.parent is not None
    assert call.parent.span_id == process.context.span_id
    assert call.context is not None and call.context.trace_id == process.context.trace_id
    assert [ids(link.context) for link in call.links] == [ids(create.context)]
    [sent] = ses.sent
    assert attrs(call)["aws.ses.message_id"] == sent.message_id
    assert attrs(call)["fairpost.ses_verdict"] == "sent"
    assert call.status.status_code is not StatusCode.ERROR
    assert_no_mail_in(spans)


async def test_with_trace_parent_the_processing_is_a_child_of_the_applications_span(
    redis_url: str, spans: InMemorySpanExporter, app_tracer: trace.Tracer
) -> None:
    settings = quick_settings(redis_url, trace_parent=True)
    tracing = Tracing(trace.get_tracer("fairpost"), parent=settings.trace_parent)
    async with pipeline(settings, tracing=tracing):
        job_id, app = await send_in_span(settings, app_tracer)
        await wait_for_async(
            lambda: ended(spans, job_id, "sent"), within=15, what="the mail's processing span"
        )
    [create] = of_job(spans, "create ", job_id)
    [process] = of_job(spans, "process ", job_id)
    [call] = of_job(spans, "SESv2.", job_id)
    assert create.context is not None and process.parent is not None
    assert process.parent.span_id == create.context.span_id
    trace_id = app.get_span_context().trace_id
    assert [s.context.trace_id for s in (create, process, call) if s.context] == [trace_id] * 3
    assert [ids(link.context) for link in process.links] == [ids(create.context)]


async def test_a_mail_sent_outside_any_span_still_gets_the_daemons_spans(
    redis_url: str, spans: InMemorySpanExporter, tracing: Tracing
) -> None:
    settings = quick_settings(redis_url)
    async with pipeline(settings, tracing=tracing), AsyncMailClient(settings) as client:
        job_id = await client.send("acme", **MAIL)
        await wait_for_async(
            lambda: ended(spans, job_id, "sent"), within=15, what="the mail's processing span"
        )
    [process] = of_job(spans, "process ", job_id)
    assert process.parent is None and process.links == ()
    assert "fairpost.priority" not in attrs(process)  # the application's trace carries it
    assert [s.links for s in named(spans, "send ")] == [()]
    assert of_job(spans, "create ", job_id) == []
    assert len(of_job(spans, "SESv2.", job_id)) == 1


async def test_a_throttled_tenants_wait_is_an_event_of_the_same_processing(
    redis_url: str, ses: SesServer, spans: InMemorySpanExporter, app_tracer: trace.Tracer, tracing: Tracing
) -> None:
    settings = quick_settings(redis_url, tenant_limits="1/second")
    async with pipeline(settings, tracing=tracing), AsyncMailClient(settings) as client:
        with app_tracer.start_as_current_span("app"):
            ids = await client.send_many("acme", [MAIL, MAIL])
        await wait_for_async(
            lambda: all(ended(spans, job_id, "sent") for job_id in ids), within=15, what="both mails sent"
        )
    waited = [s for job_id in ids for s in of_job(spans, "process ", job_id) if s.events]
    assert len(waited) == 1
    [span] = waited
    # Waits the sender times itself (a refusal may come a bucket early: asked again).
    for event in span.events:
        assert event.name == "fairpost.wait"
        assert dict(event.attributes or {})["fairpost.wait_reason"] == "tenant_quota"
        assert 0 < waited_seconds(event) <= PRECISE_WAIT_MAX
    # A wait of under two seconds is timed by the sender: the same processing goes on.
    assert attrs(span)["fairpost.state"] == "sent"
    assert len(of_job(spans, "process ", str(attrs(span)["fairpost.job_id"]))) == 1
    assert len(ses.sent) == 2


async def test_a_mail_parked_for_its_quota_is_the_same_job_across_its_receives(
    redis_url: str, spans: InMemorySpanExporter, app_tracer: trace.Tracer, tracing: Tracing
) -> None:
    settings = quick_settings(redis_url, tenant_limits="1/3 seconds")
    async with pipeline(settings, tracing=tracing), AsyncMailClient(settings) as client:
        with app_tracer.start_as_current_span("app"):
            first, second = await client.send_many("acme", [MAIL, MAIL])
        await wait_for_async(lambda: ended(spans, second, "sent"), within=20, what="the parked mail sent")
    [create] = of_job(spans, "create ", second)
    receives = sorted(of_job(spans, "process ", second), key=lambda s: s.start_time or 0)
    assert len(receives) >= 2
    assert [attrs(s)["fairpost.state"] for s in receives] == ["dispatched"] * (len(receives) - 1) + ["sent"]
    assert all([ids(link.context) for link in s.links] == [ids(create.context)] for s in receives)
    [wait] = receives[0].events
    assert dict(wait.attributes or {})["fairpost.wait_reason"] == "tenant_quota"
    assert waited_seconds(wait) > 2.0
    assert ended(spans, first, "sent")


async def test_an_ses_refusal_is_recorded_on_the_call_without_an_address(
    redis_url: str, ses: SesServer, spans: InMemorySpanExporter, app_tracer: trace.Tracer, tracing: Tracing
) -> None:
    ses.fail_next(1, Faults.MESSAGE_REJECTED.with_message("Rejected: ada@example.org is on a blocklist"))
    settings = quick_settings(redis_url)
    async with pipeline(settings, tracing=tracing):
        job_id, _ = await send_in_span(settings, app_tracer)
        await wait_for_async(
            lambda: ended(spans, job_id, "dead"), within=15, what="the mail's processing span"
        )
    [call] = of_job(spans, "SESv2.", job_id)
    assert call.status.status_code is StatusCode.ERROR
    assert "<address>" in (call.status.description or "")
    assert attrs(call)["error.type"] == "MessageRejected"
    assert attrs(call)["fairpost.ses_verdict"] == "permanent"
    assert "aws.ses.message_id" not in attrs(call)
    [exception] = call.events
    assert exception.name == "exception"
    [process] = of_job(spans, "process ", job_id)
    assert attrs(process)["fairpost.state"] == "dead"
    assert attrs(process)["fairpost.dead_reason"] == "rejected"
    assert_no_mail_in(spans)
