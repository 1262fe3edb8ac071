"""The daemon's spans (OpenTelemetry, the ``otel`` extra): docs/operations.md, "Tracing".

Tracing is on when the standard variables name an exporter
(``OTEL_TRACES_EXPORTER``, or an ``OTEL_EXPORTER_OTLP_*ENDPOINT``); the rest is
the SDK's own reading of them (``OTEL_SERVICE_NAME``, default ``fairpost``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, the
exporters' ``OTEL_EXPORTER_OTLP_*``). Off, :func:`from_env` gives None and every
hook in the daemon is one ``is None`` test: no span, no attributes built.

The spans follow the messaging conventions: the hand-off to SQS (PRODUCER,
``send <queue>``, linked to each job's creation), each received job's
processing (CONSUMER, ``process <queue>``, linked to the application's span,
or its child with ``FAIRPOST_TRACE_PARENT=true``) with its quota waits as
``fairpost.wait`` events and its final ``fairpost.state``, and its SES call
(CLIENT, ``SESv2.SendEmail``). No address, subject or body goes into a span.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from fairpost.config import ConfigError, Settings
from fairpost.mailer.sdk.envelope import Envelope, payload_trace

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: tracing stays off
    INSTALLED = False
else:
    INSTALLED = True

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("fairpost.tracing")

SERVICE_NAME = "fairpost"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` name one."""

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_EXPORTER_GROUP = "opentelemetry_traces_exporter"
_CLOSE_SECONDS = 5.0
"""The most a shutdown waits for the last spans to leave (an unreachable collector
must not hold up a replica's exit)."""


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The span exporters the standard variables ask for (their entry point names);
    none: tracing is off. ``otlp`` speaks ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``,
    by default ``http/protobuf`` as the specification says."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names:
        # Unset: the specification's default (otlp) only when a collector is named,
        # so that an installed extra alone sends nothing anywhere.
        names = "otlp" if any(environ.get(name) for name in _ENDPOINTS) else "none"
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    if chosen == ["none"]:
        return []
    protocol = next((environ[name].strip() for name in _PROTOCOLS if environ.get(name)), "http/protobuf")
    if "otlp" in chosen and protocol not in _OTLP_BY_PROTOCOL:
        raise ConfigError([(_protocol_variable(environ), "must be http/protobuf or grpc")])
    return [_OTLP_BY_PROTOCOL[protocol] if name == "otlp" else name for name in chosen if name != "none"]


def _protocol_variable(environ: Mapping[str, str]) -> str:
    return next(name for name in _PROTOCOLS if environ.get(name))


def from_env(settings: Settings, environ: Mapping[str, str] | None = None) -> Tracing | None:
    """The daemon's tracing as the ``OTEL_*`` variables configure it; None when off.
    Raises :class:`ConfigError` naming the variable when they ask for the impossible."""
    environ = os.environ if environ is None else environ
    names = exporter_names(environ)
    if not names:
        return None
    if not INSTALLED:
        raise ConfigError(
            [("OTEL_TRACES_EXPORTER", "traces need the otel extra: pip install 'fairpost[otel]'")]
        )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = []
    for name in names:
        found = entry_points(group=_EXPORTER_GROUP, name=name)
        if not found:
            known = sorted({"otlp", "none", *entry_points(group=_EXPORTER_GROUP).names})
            raise ConfigError([("OTEL_TRACES_EXPORTER", f"unknown exporter {name!r}; one of {known}")])
        exporters.append(next(iter(found)).load()())
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    # Sampler (OTEL_TRACES_SAMPLER), limits and batching (OTEL_BSP_*) are the SDK's reading.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: spans go to %s", ", ".join(names))
    return Tracing(provider.get_tracer("fairpost"), parent=settings.trace_parent, provider=provider)


_JOBS: ContextVar[Mapping[str, JobTrace] | None] = ContextVar("fairpost_job_traces", default=None)
"""The traces of the jobs whose group is being handled in this task, by job id:
how the SES call (mailer/daemon/ses.py) finds the span it is a child of."""


def job_trace(job_id: str) -> JobTrace | None:
    """The processing span of ``job_id`` in this task; None when untraced."""
    traces = _JOBS.get()
    return None if traces is None else traces.get(job_id)


@contextmanager
def handling(traces: Mapping[str, JobTrace]) -> Iterator[None]:
    """Within the block (and the tasks it starts), :func:`job_trace` finds these."""
    token = _JOBS.set(traces)
    try:
        yield
    finally:
        _JOBS.reset(token)


class Tracing:
    """Opens the daemon's spans on one tracer."""

    def __init__(
        self, tracer: Tracer, *, parent: bool = False, provider: TracerProvider | None = None
    ) -> None:
        self.tracer = tracer
        self.parent = parent
        """FAIRPOST_TRACE_PARENT: a job's processing is a child of the application's span."""
        self._provider = provider
        self._propagator = TraceContextTextMapPropagator()

    def handoff(self, queue: str, jobs: Sequence[tuple[str, str, str]]) -> Handoff:
        """A SendMessageBatch of ``jobs`` (id, tenant, payload), linked to each one's creation."""
        links = []
        for job_id, tenant, payload in jobs:
            carrier = payload_trace(payload)
            context = self._span_context(carrier) if carrier else None
            if context is not None:
                links.append(Link(context, {"fairpost.job_id": job_id, "fairpost.tenant_id": tenant}))
        span = self.tracer.start_span(
            f"send {queue}",
            context=Context(),  # a batch of many traces' jobs: a trace of its own
            kind=SpanKind.PRODUCER,
            links=links,
            attributes={
                "messaging.system": "aws_sqs",
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": queue,
                "messaging.batch.message_count": len(jobs),
            },
        )
        return Handoff(span)

    def received(self, queue: str, message_id: str, env: Envelope) -> JobTrace:
        """The processing of one received job, until its message is settled."""
        context = self._span_context(env.trace) if env.trace else None
        attributes: dict[str, Any] = {
            "messaging.system": "aws_sqs",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": message_id,
            "fairpost.job_id": env.job_id,
            "fairpost.tenant_id": env.tenant,
            "fairpost.recipients": env.mail.recipients,
        }
        priority = env.trace.get("priority") if env.trace else None
        if priority:
            attributes["fairpost.priority"] = priority
        parent = Context()  # a root, whatever the task's context holds
        if context is not None and self.parent:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(context))
        span = self.tracer.start_span(
            f"process {queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=[Link(context)] if context is not None else None,
            attributes=attributes,
        )
        return JobTrace(self.tracer, span, env.job_id, env.tenant, context)

    def _span_context(self, carrier: Mapping[str, str]) -> trace.SpanContext | None:
        context = trace.get_current_span(self._propagator.extract(carrier)).get_span_context()
        return context if context.is_valid else None

    def close(self) -> None:
        """Export what is left, waiting at most a few seconds."""
        if self._provider is None:
            return
        closing = threading.Thread(target=self._provider.shutdown, name="tracing-close", daemon=True)
        closing.start()
        closing.join(_CLOSE_SECONDS)


class Handoff:
    """The span of one SendMessageBatch."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def end(self, handed_off: int, refused: int, failure: str | None) -> None:
        """``failure``: the call failed (a short, address-free description)."""
        self.span.set_attribute("fairpost.handed_off", handed_off)
        if refused:
            self.span.set_attribute("fairpost.refused", refused)
        if failure is not None:
            self.span.set_attribute("error.type", failure)
            self.span.set_status(Status(StatusCode.ERROR, failure))
        self.span.end()


class JobTrace:
    """One received job's processing span, and what became of the job."""

    __slots__ = ("created", "job_id", "span", "state", "tenant", "tracer")

    def __init__(
        self, tracer: Tracer, span: Span, job_id: str, tenant: str, created: trace.SpanContext | None = None
    ) -> None:
        self.tracer = tracer
        self.span = span
        self.job_id = job_id
        self.tenant = tenant
        self.created = created
        """The application's context the job was created in (the SDK's ``create`` span)."""
        self.state: str | None = None
        """Set as the job ends here (``sent``, ``dead``, ``suppressed``...)."""

    def wait(self, reason: str, seconds: float) -> None:
        """The job waits for its quota (or a pause, or an SES hold) ``seconds``."""
        self.span.add_event(
            "fairpost.wait", {"fairpost.wait_reason": reason, "fairpost.wait_seconds": round(seconds, 3)}
        )

    def dead(self, kind: str) -> None:
        """The job ends dead here; ``kind``: the metrics label of its reason."""
        self.state = "dead"
        self.span.set_attribute("fairpost.dead_reason", kind)

    def ses_call(self) -> SesCall:
        span = self.tracer.start_span(
            "SESv2.SendEmail",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            # Linked to the application's span too: found from either trace.
            links=[Link(self.created)] if self.created is not None else None,
            attributes={
                "rpc.system": "aws-api",
                "rpc.service": "SESv2",
                "rpc.method": "SendEmail",
                "fairpost.job_id": self.job_id,
                "fairpost.tenant_id": self.tenant,
            },
        )
        return SesCall(self, span)

    def end(self, state: str, error: str | None = None) -> None:
        """The job's message is settled for this receive; ``state``: unless set earlier."""
        self.span.set_attribute("fairpost.state", self.state or state)
        if error is not None:
            self.span.set_attribute("error.type", error)
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()


class SesCall:
    """The span of one SES SendEmail."""

    def __init__(self, job: JobTrace, span: Span) -> None:
        self.job = job
        self.span = span

    def answered(self, verdict: str, message_id: str | None, error: str | None, code: str | None) -> None:
        """SES's answer; ``error`` is redacted already (mailer/daemon/ses.py, ``redact``)."""
        span = self.span
        span.set_attribute("fairpost.ses_verdict", verdict)
        if message_id:
            span.set_attribute("aws.ses.message_id", message_id)
        if error is not None:
            span.set_attribute("error.type", code or verdict)
            span.add_event("exception", {"exception.type": code or verdict, "exception.message": error})
            span.set_status(Status(StatusCode.ERROR, error))
        if verdict == "sent":
            self.job.state = "sent"
        span.end()

    def failed(self, exc: BaseException) -> None:
        """No answer: the call raised (cancelled at shutdown, or a bug)."""
        self.span.set_attribute("error.type", type(exc).__name__)
        self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        self.span.end()
