"""An OTLP/HTTP trace receiver for tests: what a collector would be, decoding the
protobuf itself (``POST /v1/traces``, ``application/x-protobuf``)."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def attributes_of(pairs: Any) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it; ids as integers, like the SDK's."""

    service: str
    name: str
    kind: int
    trace_id: int
    span_id: int
    parent_span_id: int | None
    attributes: dict[str, Any]
    links: list[tuple[int, int, dict[str, Any]]]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int


@dataclass
class OtlpReceiver:
    url: str
    spans: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        decoded = []
        for resource_spans in request.resource_spans:
            service = str(attributes_of(resource_spans.resource.attributes).get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    decoded.append(
                        Received(
                            service=service,
                            name=span.name,
                            kind=span.kind,
                            trace_id=int.from_bytes(span.trace_id, "big"),
                            span_id=int.from_bytes(span.span_id, "big"),
                            parent_span_id=int.from_bytes(span.parent_span_id, "big")
                            if span.parent_span_id
                            else None,
                            attributes=attributes_of(span.attributes),
                            links=[
                                (
                                    int.from_bytes(link.trace_id, "big"),
                                    int.from_bytes(link.span_id, "big"),
                                    attributes_of(link.attributes),
                                )
                                for link in span.links
                            ],
                            events=[(event.name, attributes_of(event.attributes)) for event in span.events],
                            status_code=span.status.code,
                        )
                    )
        with self.lock:
            self.spans.extend(decoded)

    def named(self, prefix: str) -> list[Received]:
        with self.lock:
            return [s for s in self.spans if s.name.startswith(prefix)]


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    holder: list[OtlpReceiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            holder[0].add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(OtlpReceiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
