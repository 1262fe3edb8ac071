"""The application's side (issue 30, item 2): the caller's trace context goes into
the job when a span is active, and nothing does when none is or when
OpenTelemetry is not there at all."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest
import redis.asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from fairpost import AsyncMailClient, MailClient, RedisFailed
from fairpost.config import load_settings
from fairpost.mailer.sdk.envelope import Envelope, decode
from tests.support import message_body
from tests.tracing.conftest import named

MAIL = {"sender": "app@acme.example", "to": ["ada@example.org"], "subject": "Reset", "text": "hello"}


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def envelope_of(aredis: redis.asyncio.Redis, job_id: str) -> Envelope:
    return decode(await message_body(aredis, job_id))


async def test_a_send_inside_a_span_records_its_creation_span_in_the_job(
    client: MailClient, aredis: redis.asyncio.Redis, spans: InMemorySpanExporter, app_tracer: trace.Tracer
) -> None:
    with app_tracer.start_as_current_span("POST /password-reset") as app:
        job_id = client.send("acme", priority="high", **MAIL)  # type: ignore[arg-type]
    [create] = named(spans, "create ")
    assert create.name == "create mail"
    assert create.kind is SpanKind.PRODUCER
    assert create.parent is not None and create.parent.span_id == app.get_span_context().span_id
    assert create.context is not None and create.context.trace_id == app.get_span_context().trace_id
    assert dict(create.attributes or {}) == {
        "messaging.system": "fairpost",
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.destination.name": "mail",
        "messaging.message.id": job_id,
        "fairpost.job_id": job_id,
        "fairpost.tenant_id": "acme",
        "fairpost.priority": "high",
    }
    env = await envelope_of(aredis, job_id)
    # The job carries the creation span's context: the daemon's spans link to it.
    assert env.trace == {"traceparent": traceparent_of(create), "priority": "high"}


async def test_send_many_gives_each_job_a_creation_span_of_its_own(
    aclient: AsyncMailClient,
    aredis: redis.asyncio.Redis,
    spans: InMemorySpanExporter,
    app_tracer: trace.Tracer,
) -> None:
    with app_tracer.start_as_current_span("batch") as app:
        ids = await aclient.send_many("acme", [MAIL, {**MAIL, "to": ["bob@example.org"]}])
    creates = named(spans, "create ")
    assert [dict(c.attributes or {})["fairpost.job_id"] for c in creates] == ids
    for job_id, create in zip(ids, creates, strict=True):
        assert create.parent is not None and create.parent.span_id == app.get_span_context().span_id
        env = await envelope_of(aredis, job_id)
        assert env.trace is not None and env.trace["traceparent"] == traceparent_of(create)


async def test_the_async_send_records_the_context_too(
    aclient: AsyncMailClient,
    aredis: redis.asyncio.Redis,
    spans: InMemorySpanExporter,
    app_tracer: trace.Tracer,
) -> None:
    with app_tracer.start_as_current_span("app"):
        job_id = await aclient.send("acme", **MAIL)  # type: ignore[arg-type]
    [create] = named(spans, "create ")
    env = await envelope_of(aredis, job_id)
    assert env.trace == {"traceparent": traceparent_of(create), "priority": "normal"}


async def test_with_opentelemetry_loaded_but_no_span_active_nothing_is_recorded(
    client: MailClient, aredis: redis.asyncio.Redis, spans: InMemorySpanExporter
) -> None:
    assert "opentelemetry.trace" in sys.modules
    assert not trace.get_current_span().get_span_context().is_valid
    job_id = client.send("acme", **MAIL)  # type: ignore[arg-type]
    body = await message_body(aredis, job_id)
    assert decode(body).trace is None
    assert '"trace"' not in body
    assert spans.get_finished_spans() == ()


def test_a_failed_enqueue_ends_its_creation_span_as_an_error(
    spans: InMemorySpanExporter, app_tracer: trace.Tracer
) -> None:
    # Nothing listens on port 9: the enqueue fails at once (no retries).
    settings = load_settings(redis_url="redis://127.0.0.1:9/0", redis_retry_seconds=0)
    with MailClient(settings) as client, app_tracer.start_as_current_span("app"), pytest.raises(RedisFailed):
        client.send("acme", **MAIL)  # type: ignore[arg-type]
    [create] = named(spans, "create ")
    assert create.status.status_code is StatusCode.ERROR
    assert dict(create.attributes or {})["error.type"] == "RedisFailed"


SEND_WITHOUT_OPENTELEMETRY = textwrap.dedent(
    """
    import json, sys
    sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
    from fairpost import MailClient
    from fairpost.config import load_settings
    client = MailClient(load_settings(redis_url=sys.argv[1]))
    job_id = client.send("acme", sender="app@acme.example", to=["ada@example.org"],
                         subject="hi", text="hello")
    print(json.dumps({"job_id": job_id, "otel": sorted(m for m in sys.modules
                      if m.startswith("opentelemetry") and sys.modules[m] is not None)}))
    """
)


async def test_send_works_without_opentelemetry(redis_url: str, aredis: redis.asyncio.Redis) -> None:
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", SEND_WITHOUT_OPENTELEMETRY, redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(result.stdout)
    assert out["otel"] == []
    assert decode(await message_body(aredis, out["job_id"])).trace is None


LOADED_OTEL = "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))"


def test_importing_the_sdk_loads_nothing_of_opentelemetry_beyond_what_redis_does() -> None:
    # redis-py (8.x) loads OpenTelemetry's metrics API itself when it is installed.
    loaded = {}
    for what in ("redis", "fairpost"):
        code = f"import json, sys, {what}; {LOADED_OTEL}"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        loaded[what] = json.loads(result.stdout)
    assert loaded["fairpost"] == loaded["redis"]
    # What fairpost needs of it is loaded only for a send inside a span.
    assert "opentelemetry.trace.propagation.tracecontext" not in loaded["fairpost"]
