"""Redis memory a sent mail keeps for its retention: a budget, so that it cannot creep
up unseen (issue #41).

bench/finished_memory.py's measure on bench/budget.py's workload (2,000 mails of 20
tenants through one replica, SES events on, every retention its default): each key
the workload leaves, its ``MEMORY USAGE`` and what Redis's tables keep for it
(bench/key_tables.py: 64 bytes a key with a TTL), times how long it stays, over the
retention, a mail. Both count the allocations of each key, the same on any machine
with the same Redis; no timing, no ``used_memory`` (which moves with what else the
server holds). The bench prints the same figure and its
``used_memory`` beside it (BENCHMARKS.md).

Raise a budget only with the reason in the commit message that raises it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from bench.budget import MAILS
from bench.finished_memory import kept_for_retention, left_behind, with_events, workload
from fairpost.dispatcher.history import record_of_line
from fairpost.dispatcher.replies import text
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import RedisServer, redis_server
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.sqs_server import SqsServer

TOTAL = 250.0
"""Bytes a sent mail keeps for its retention, at most: #41's goal."""

BUDGET = {
    # A line in a day's history bucket (listpack), the retention and half a day:
    # 93 to 98 over five runs (the job ids, random, spread the lines over the
    # buckets, and a listpack grows by the allocator's size classes).
    "hist": 110.0,
    # The whole record (424 bytes and 64 of Redis's tables), FAIRPOST_JOB_DETAIL_TTL
    # (a day) of the week: 69.7.
    "job": 75.0,
    # The outcome feed's mail.sent event (about 225 bytes), FAIRPOST_OUTCOMES__MAX_AGE (a day).
    "outcomes": 35.0,
    # The SES message id's index (184 bytes and 64 of the tables), FAIRPOST_SES_INDEX_TTL
    # (a day): 35.4.
    "sesmsg": 40.0,
}
"""Bytes a mail, by kind of key (bench.finished_memory.kind_of), at most."""

OTHERS = 10.0
"""Every other kind together (reputation, deliverability, counters): per tenant or
per day, not per mail; at most this much a mail of the workload."""


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


async def test_a_sent_mail_keeps_at_most_its_budget_of_redis_memory(
    own_redis: RedisServer, ses_env: SesServer, fifo_sqs_srv: SqsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo_sqs_srv.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", fifo_sqs_srv.url)
    settings = with_events(own_redis.url())
    await workload(settings)
    client = redis.Redis.from_url(own_redis.url())
    try:
        kept = kept_for_retention(left_behind(client, settings), settings, MAILS)
        mail_keys = MailKeys(settings.key_prefix)
        lines = [
            record_of_line(text(line), mail_keys.history_fields())
            for bucket in client.scan_iter(match=mail_keys.history_prefix() + "*")
            for line in client.hvals(bucket)
        ]
    finally:
        client.close()
    shown = ", ".join(f"{kind} {b}" for kind, b in kept.items())
    over = [
        f"{kind}: {kept.get(kind, 0.0)} > {most}"
        for kind, most in BUDGET.items()
        if kept.get(kind, 0.0) > most
    ]
    others = sum(b for kind, b in kept.items() if kind not in BUDGET)
    assert not over, f"over its budget: {over} (bytes a mail: {shown})"
    assert others <= OTHERS, f"other keys {others} bytes a mail > {OTHERS} ({shown})"
    assert sum(kept.values()) <= TOTAL, f"{sum(kept.values())} bytes a mail > {TOTAL} ({shown})"
    # The history answers for the mails: a line for each, with its send number (the
    # sender numbers a mail in the pipeline before the record of its send).
    assert len(lines) == MAILS
    assert all(int(line["send_seq"]) > 0 for line in lines)
