"""What tracing costs (issue #30): the daemon's CPU and Redis's cost per mail, three ways.

- **not installed**: the replica as if the ``otel`` extra were absent: every
  ``import opentelemetry...`` in it raises ``ModuleNotFoundError``
  (``BENCH_WITHOUT_OTEL=1``, :mod:`bench.replica`), so the daemon takes its own
  "not installed" path (mailer/daemon/tracing.py, ``INSTALLED = False``); the
  replica reports that none of OpenTelemetry was imported.
- **off**: the extra installed (OpenTelemetry imported), no ``OTEL_*``
  variable: what every operator who has not turned tracing on runs.
- **on**: ``OTEL_TRACES_EXPORTER=otlp`` to a local OTLP/HTTP sink
  (:mod:`bench.sink`, its own process), the SDK's batching with a 1 s schedule
  delay (so each round's last spans leave within it; every span of the round
  reaches the sink inside the measured interval); the application sends inside
  a span of its own (an OpenTelemetry SDK tracer provider in the bench's
  process), so each job carries its trace context and the daemon's spans link
  to it.

Rounds of the three side by side, each on a Redis of its own
(:mod:`bench.variants`); each figure is the median of the rounds' ratios to
"not installed". The application's own cost (the SDK's ``create`` spans) is not
in these figures: it is in the bench's process, not the daemon's or Redis's.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections import Counter
from collections.abc import Iterator

from bench.cluster import Backend, BenchError, World
from bench.figures import Figure
from bench.sink import Sink
from bench.variants import Drained, Variant, median_per_mail, ratios, rounds, spread
from fairpost.mailer.errors import TimedOut
from fairpost.mailer.testing.wait import wait_for_async

SES_SPAN = "SESv2.SendEmail"
UNBOUND = {"global_limits": "100000/second", "tenant_limits": "100000/second"}
TARGET = 1.03
"""Tracing off costs at most 3 % over not installed (issue #30, build 4)."""


@contextlib.contextmanager
def application_span() -> Iterator[None]:
    """The application's request span, on a real (SDK) tracer provider: spans it records
    go nowhere (no processor); what matters is the context each job carries."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    with trace.get_tracer("bench.application").start_as_current_span("POST /bench"):
        yield


class SpanCount:
    """Waits until the sink holds every span of a round's mails; keeps each round's spans."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.seen = self._count()
        self.rounds: list[tuple[int, Counter[str]]] = []
        """Each round's mails and spans by name (the queue's name as ``<queue>``); the first
        is the round not counted."""

    def _count(self) -> Counter[str]:
        spans: Counter[str] = Counter()
        for name, n in self.sink.spans().items():
            kind, _, queue = name.partition(" ")
            spans[f"{kind} <queue>" if queue else name] += n
        return spans

    async def settled(self, w: World, mails: int) -> None:
        got = self.seen

        def arrived() -> bool:
            nonlocal got
            got = self._count()
            return all(got[name] - self.seen[name] >= mails for name in ("process <queue>", SES_SPAN))

        try:
            await wait_for_async(arrived, within=30, what="the round's spans at the sink", interval=0.1)
        except TimedOut:
            raise BenchError(f"spans at the sink: {dict(got - self.seen)} for {mails} mails") from None
        self.rounds.append((mails, got - self.seen))
        self.seen = got

    def per_mail(self) -> str:
        mails = sum(m for m, _ in self.rounds[1:])
        spans = sum((c for _, c in self.rounds[1:]), Counter[str]())
        return ", ".join(f"{name} {n / mails:.2f}" for name, n in sorted(spans.items()))


def figure(
    key: str, title: str, results: list[dict[str, Drained]], what: str, variant: str, target: float | None
) -> Figure:
    values = ratios(results, what, variant, "not installed")
    unit = "ms" if what == "daemon_cpu" else "µs"
    scale = 1000 if what == "daemon_cpu" else 1_000_000
    each = ", ".join(
        f"{name} {scale * median_per_mail(results, what, name):.{2 if unit == 'ms' else 1}f} {unit}"
        for name in results[0]
    )
    commands = ", ".join(f"{name} {median_per_mail(results, 'commands', name):.2f}" for name in results[0])
    net = ", ".join(f"{name} {median_per_mail(results, 'net_bytes', name):.0f}" for name in results[0])
    mails = results[0][variant].mails
    return Figure(
        key=key,
        title=title,
        value=statistics.median(values),
        unit="x",
        op="<=" if target is not None else None,
        target=target,
        detail=(
            f"{spread(values)}; per mail (medians): {each}; Redis commands {commands}; "
            f"Redis bytes in+out {net}; {mails} mails of 20 tenants a round, a replica and a Redis each, "
            "side by side, enqueue included"
        ),
        data={"ratios": values, "rounds": [{k: vars(v) for k, v in r.items()} for r in results]},
    )


async def run(backend: Backend, quick: bool) -> list[Figure]:
    if any(name.startswith("OTEL_") for name in os.environ):
        raise BenchError("OTEL_* variables are set: the variants would not be what they say")
    # Five rounds: the variants send the same commands and bytes, and one round's
    # Redis CPU ratio strays by up to 8 % either way; the median of three did too.
    mails, count = (100, 1) if quick else (2000, 5)
    sink = Sink(backend.workdir)
    try:
        spans = SpanCount(sink)
        variants = [
            Variant("not installed", {"BENCH_WITHOUT_OTEL": "1"}, otel_imported=False),
            Variant("off", otel_imported=True),
            Variant(
                "on",
                {
                    "OTEL_TRACES_EXPORTER": "otlp",
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{sink.url}/v1/traces",
                    "OTEL_BSP_SCHEDULE_DELAY": "1000",
                },
                around=application_span,
                settled=spans.settled,
                otel_imported=True,
            ),
        ]
        results = await rounds(backend, "tracing", UNBOUND, variants, mails, count)
    finally:
        sink.stop()
    shown = spans.per_mail()
    figures = []
    for variant, label, target in (("off", "off (otel installed)", TARGET), ("on", "on (OTLP/HTTP)", None)):
        for what, key, cost in (("daemon_cpu", "cpu", "daemon CPU"), ("redis_cpu", "redis", "Redis CPU")):
            title = f"Tracing {label} / not installed: {cost} per mail"
            f = figure(f"tracing_{variant}_{key}_ratio", title, results, what, variant, target)
            if variant == "on":
                f.detail += f"; spans exported per mail: {shown}"
            figures.append(f)
    return figures
