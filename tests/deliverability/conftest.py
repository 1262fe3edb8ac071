"""The deliverability tests' fixtures (tests/support/deliverability.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import SesServer
from tests.support.deliverability import FakeDns, events_to


@pytest.fixture
def fake_dns() -> FakeDns:
    return FakeDns()


@pytest.fixture
def events(ses_env: SesServer, redis_url: str) -> Iterator[EventSink]:
    with events_to(ses_env, redis_url) as sink:
        yield sink
