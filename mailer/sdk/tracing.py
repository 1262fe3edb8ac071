"""The application's side of a trace through fairpost (OpenTelemetry, the ``otel`` extra).

When ``send``/``send_many`` run inside the caller's span, each job gets a
PRODUCER span, ``create mail`` as the messaging conventions name the creation
of a message, and that span's W3C trace context goes into the job's payload
(:data:`fairpost.mailer.sdk.envelope.TRACE`): the daemon's spans link to it
(docs/operations.md, "Tracing").

Nothing here imports OpenTelemetry. A caller with a span active has imported
``opentelemetry.trace`` already; one that has not cannot have a span active,
so the SDK looks in ``sys.modules`` and, finding nothing, changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from fairpost.dispatcher.jobs import NewJob
from fairpost.mailer.sdk.envelope import with_trace

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["Creating"]

SYSTEM = "fairpost"
"""``messaging.system`` of the creation spans: the queue is fairpost's, in Redis."""


@functools.cache
def _tracer() -> Tracer:
    """Once: a tracer costs more to make than a span. An application sets its provider
    before it traces; one got before that follows it there (the API's proxy)."""
    from opentelemetry import trace

    return trace.get_tracer("fairpost")


class Creating:
    """``with Creating(jobs) as jobs:`` the jobs to submit (traced, if a span is
    active), each under its creation span until the block ends."""

    def __init__(self, jobs: Sequence[NewJob]) -> None:
        self._jobs = list(jobs)
        self._spans: list[Span] = []

    def __enter__(self) -> list[NewJob]:
        if sys.modules.get("opentelemetry.trace") is None:
            return self._jobs
        from opentelemetry import trace

        if not trace.get_current_span().get_span_context().is_valid:
            return self._jobs
        return self._traced(_tracer())

    def _traced(self, tracer: Tracer) -> list[NewJob]:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        propagator = TraceContextTextMapPropagator()
        traced = []
        for job in self._jobs:
            span = tracer.start_span(
                f"create {job.kind}",
                kind=trace.SpanKind.PRODUCER,
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.operation.type": "create",
                    "messaging.operation.name": "create",
                    "messaging.destination.name": job.kind,
                    "messaging.message.id": job.id,
                    "fairpost.job_id": job.id,
                    "fairpost.tenant_id": job.tenant,
                    "fairpost.priority": job.priority,
                },
            )
            self._spans.append(span)
            carrier: dict[str, str] = {}
            propagator.inject(carrier, context=trace.set_span_in_context(span))
            carrier["priority"] = job.priority
            traced.append(dataclasses.replace(job, payload=with_trace(job.payload, carrier)))
        return traced

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._spans:
            return
        from opentelemetry.trace import Status, StatusCode

        for span in self._spans:
            if exc is not None:
                # The type alone: an error's text is not the span's to carry.
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end()
