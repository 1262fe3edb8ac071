"""For the tests of deliverability by mailbox provider: a local fake of the MX lookup
(there is no DNS here, nor in CI: the lookup is injectable, mailer/daemon/mx.py), and
SES events played onto a real SQS queue (moto), as tests/daemon/test_reputation.py does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import boto3

from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import SesServer
from tests.support.pipeline import quick_settings

EVENTS_QUEUE = "fairpost-events"

MX = {
    # A Google Workspace domain and a Microsoft 365 one, as their MX records read.
    "workspace.example": ["aspmx.l.google.com.", "alt1.aspmx.l.google.com."],
    "m365.example": ["m365-example.mail.protection.outlook.com."],
    "self-hosted.example": ["mx1.self-hosted.example."],
}


class FakeDns:
    """MX answers from :data:`MX`; ``down`` makes every lookup fail as DNS away would."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.down = False

    async def __call__(self, domain: str, lifetime: float) -> list[str]:
        self.asked.append(domain)
        if self.down:
            raise OSError("no route to the resolver")
        return MX.get(domain, [])


@contextmanager
def events_to(ses: SesServer, redis_url: str) -> Iterator[EventSink]:
    """SES publishes its events to the events queue, wrapped as SNS delivers them."""
    sqs = boto3.client("sqs")
    url, _ = init_events_queue(sqs, quick_settings(redis_url, events_queue_name=EVENTS_QUEUE))
    sink = EventSink(sqs, url, envelope="sns")
    ses.events = sink
    try:
        yield sink
    finally:
        sink.close()
