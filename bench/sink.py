"""A local receiver for the bench, in its own process: webhook endpoints and an OTLP/HTTP trace sink.

``python -m bench.sink --port N`` serves:

- ``POST /hooks/<name>``: a webhook endpoint. Each delivery is verified with
  the Standard Webhooks specification's own library (``standardwebhooks``, not
  fairpost's code) under the secret given for ``<name>`` (``PUT
  /secrets/<name>``), its arrival time kept (``time.monotonic()``, the same
  clock in every process of the machine); answered 200 at once.
- ``POST /v1/traces``: what a collector is to the daemon's OTLP/HTTP exporter;
  the spans in each request are decoded and counted by name, answered 200.
- ``GET /stats``: what arrived, as JSON.

Its own process, so that what it costs is in neither the daemon's CPU nor the
bench driver's event loop. :class:`Sink` starts and reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from fairpost.mailer.testing.services import ManagedProcess, free_port


def serve(port: int) -> None:
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    secrets: dict[str, Webhook] = {}
    arrivals: list[float] = []
    event_ids: set[str] = set()
    unverified = Counter[str]()
    spans = Counter[str]()
    empty = ExportTraceServiceResponse().SerializeToString()

    async def hook(request: web.Request) -> web.Response:
        body = await request.text()
        name = request.match_info["name"]
        headers = {k.lower(): v for k, v in request.headers.items()}
        verifier = secrets.get(name)
        try:
            if verifier is None:
                raise WebhookVerificationError("no secret for this endpoint")
            verifier.verify(body, headers)
        except WebhookVerificationError as exc:
            unverified[str(exc)[:80]] += 1
        else:
            arrivals.append(time.monotonic())
            event_ids.add(headers.get("webhook-id", ""))
        return web.Response(text="ok")

    async def secret(request: web.Request) -> web.Response:
        secrets[request.match_info["name"]] = Webhook(await request.text())
        return web.Response(text="ok")

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans[span.name] += 1
        return web.Response(body=empty, content_type="application/x-protobuf")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "arrivals": arrivals,
                "distinct_events": len(event_ids),
                "unverified": dict(unverified),
                "spans": dict(spans),
            }
        )

    app = web.Application()
    app.add_routes(
        [
            web.post("/hooks/{name}", hook),
            web.put("/secrets/{name}", secret),
            web.post("/v1/traces", traces),
            web.get("/stats", stats),
        ]
    )
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class Sink:
    """The sink process, and what it received."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "bench.sink", "--port", str(self.port)]
        self.process = ManagedProcess("bench sink", argv, workdir / f"sink-{self.port}.log")
        try:
            self.process.wait_started(self._answers)
        except BaseException:
            self.process.stop()
            raise

    def _answers(self) -> bool:
        try:
            self.stats()
        except OSError:
            return False
        return True

    def hook_url(self, name: str) -> str:
        return f"{self.url}/hooks/{name}"

    def secret(self, name: str, secret: str) -> None:
        request = urllib.request.Request(f"{self.url}/secrets/{name}", data=secret.encode(), method="PUT")
        urllib.request.urlopen(request, timeout=10).close()

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=30) as answer:
            data: dict[str, Any] = json.loads(answer.read())
        return data

    def spans(self) -> Counter[str]:
        return Counter(self.stats()["spans"])

    def stop(self) -> None:
        self.process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    serve(parser.parse_args().port)


if __name__ == "__main__":
    main()
