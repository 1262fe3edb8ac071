"""Spans without a collector: the SDK's InMemorySpanExporter behind the process's
tracer provider (the application's, as an application would set it), and the
daemon's tracing on the same provider, so one list holds the whole trace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fairpost.mailer.daemon.tracing import Tracing

OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


@pytest.fixture(autouse=True)
def _no_stray_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own OTEL_* variables must not turn tracing on or off here."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def _exporter() -> InMemorySpanExporter:
    # A process has one global tracer provider, set once: this session's is this one.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """The spans ended during the test (the application's and the daemon's)."""
    _exporter.clear()
    yield _exporter
    _exporter.clear()


@pytest.fixture
def app_tracer(spans: InMemorySpanExporter) -> trace.Tracer:
    """What the application traces with."""
    return trace.get_tracer("the-application")


@pytest.fixture
def tracing(spans: InMemorySpanExporter) -> Tracing:
    """The daemon's tracing, on the same provider (links only, the default)."""
    return Tracing(trace.get_tracer("fairpost"))


def named(spans: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name.startswith(prefix)]
