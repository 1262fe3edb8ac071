"""Redis cut again and again under load: nothing sent twice, nothing lost, no stall.

Two daemon processes reach Redis through a proxy (tests/support/redis_cutter.py)
that resets every connection, and every new one for a moment, over and over,
while a throttled tenant's backlog and a trickle of other tenants' mail go out
through slow SES calls (the recording SES answers each after a second). A reset
loses a command on its way or the answer on its way back, after Redis ran it,
so a step tried again may find its own first try done.

Checked at the SES side: every job the SDK accepted reached SES exactly once (and
each mail once: none under two job ids), and no tenant's mail waited long while
SES got none of that tenant's mail (measured between SES's recorded sends).
"""

from __future__ import annotations

import collections
import functools
import itertools
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest

from fairpost import MailClient, RedisFailed
from fairpost.config import load_settings
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.sqs_server import SqsServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.daemon_process import daemon_process
from tests.support.redis_cutter import redis_cutter

pytestmark = [pytest.mark.slow]

TENANT_LIMIT = "3/second"
TRICKLE = ["t1", "t2", "t3"]
BACKLOG = 45
"""The throttled tenant's mail, enqueued at once: some fifteen seconds of its quota."""
CUTS, DOWN, UP = 12, 0.6, 1.2
LONGEST_GAP = 10.0
T = TypeVar("T")


def accepted(send: Callable[[], T]) -> T:
    """What an application does: retry a failed send (same idempotency keys) until accepted."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return send()
        except RedisFailed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def mail(tenant: str, n: int) -> dict[str, Any]:
    return {
        "sender": "app@example.com",
        "to": [f"{tenant}-{n}@example.org"],
        "subject": "s",
        "text": "t",
        "idempotency_key": f"{tenant}-{n}",
    }


def longest_waits(enqueued: dict[str, float], sent: dict[str, tuple[float, str]]) -> dict[str, float]:
    """Per tenant, the longest time a mail of it waited (accepted, not yet sent) while
    SES got none of the tenant's mail: measured from SES's recorded sends."""
    by_tenant: dict[str, list[float]] = collections.defaultdict(list)
    for at, tenant in sent.values():
        by_tenant[tenant].append(at)
    longest: dict[str, float] = {}
    for job_id, asked in enqueued.items():
        at, tenant = sent[job_id]
        moments = [asked, *sorted(t for t in by_tenant[tenant] if asked < t < at), at]
        gap = max(b - a for a, b in itertools.pairwise(moments))
        longest[tenant] = round(max(longest.get(tenant, 0.0), gap), 1)
    return longest


def test_redis_cut_again_and_again_sends_each_job_once_without_a_stall(
    redis_url: str, fifo_sqs_srv: SqsServer, ses: SesServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ses.latency = 1.0
    with redis_cutter(redis_url) as cutter:
        queue = f"cuts-{uuid.uuid4().hex[:8]}.fifo"
        env = {
            "PATH": "/usr/bin:/bin",
            "AWS_ENDPOINT_URL_SQS": fifo_sqs_srv.url,
            "AWS_ENDPOINT_URL_SESV2": ses.url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "FAIRPOST_REDIS_URL": cutter.url(),
            "FAIRPOST_QUEUE_NAME": queue,
            "FAIRPOST_GLOBAL_LIMITS": "40/second",
            "FAIRPOST_TENANT_LIMITS": TENANT_LIMIT,
            # A dispatcher claim whose answer is lost leaves its jobs leased until the
            # lease lapses (the dispatcher's own, not the sender's): kept short here.
            "FAIRPOST_DISPATCHER__LEASE_SECONDS": "5",
            "FAIRPOST_SENDER__WAIT_SECONDS": "2",
            "FAIRPOST_SHUTDOWN_GRACE": "3",
        }
        for name, value in env.items():
            if name.startswith("FAIRPOST_"):
                monkeypatch.setenv(name, value)
        settings = load_settings()
        sqs = boto3.client(
            "sqs", endpoint_url=fifo_sqs_srv.url, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        init_queue(sqs, settings)

        enqueued: dict[str, float] = {}

        def enqueue(tenant: str, mails: list[dict[str, Any]]) -> None:
            asked = time.monotonic()
            for job_id in accepted(functools.partial(client.send_many, tenant, mails)):
                enqueued.setdefault(job_id, asked)

        with (
            daemon_process(env, tmp_path, replica="r1") as r1,
            daemon_process(env, tmp_path, replica="r2") as r2,
            MailClient(settings) as client,
        ):
            enqueue("noisy", [mail("noisy", i) for i in range(BACKLOG)])
            cutter.cut_repeatedly(times=CUTS, down=DOWN, up=UP)
            start = time.monotonic()
            for tick in range(int(CUTS * (DOWN + UP) / 0.5)):
                for tenant in TRICKLE:
                    enqueue(tenant, [mail(tenant, tick)])
                # Pacing the load generator, not waiting for an outcome.
                time.sleep(max(0.0, start + (tick + 1) * 0.5 - time.monotonic()))
            cutter.wait_repeated(timeout=60)

            def settled() -> bool:
                try:
                    return all(client.status(i).state in ("sent", "dead") for i in enqueued)
                except RedisFailed:
                    return False

            # Once every job is recorded sent, no message still in SQS can reach SES again.
            wait_for(settled, within=90, what="every accepted job sent or dead", interval=0.5)
            states = {i: client.status(i) for i in enqueued}
            assert r1.process.poll() is None and r2.process.poll() is None, "a daemon gave up"
            assert r1.stop() == 0 and r2.stop() == 0

    dead = {i: s.last_error for i, s in states.items() if s.state == "dead"}
    assert not dead, f"mail dead under Redis cuts: {dead}"
    delivered = collections.Counter(m.job_id for m in ses.sent)
    twice = {i: n for i, n in delivered.items() if n > 1}
    assert not twice, f"{len(twice)} jobs reached SES more than once: {twice}"
    assert set(delivered) == set(enqueued), "lost or unknown mail"
    # Each mail has a recipient of its own: one job per idempotency key too.
    recipients = collections.Counter(r for m in ses.sent for r in m.to)
    assert max(recipients.values()) == 1, "a mail reached SES twice under two job ids"
    sent = {m.job_id or "": (m.monotonic, m.tag("fairpost-tenant") or "") for m in ses.sent}
    stalls = longest_waits(enqueued, sent)
    assert max(stalls.values()) <= LONGEST_GAP, f"a tenant's mail waited with none of its mail sent: {stalls}"
    assert len(cutter.cuts) == CUTS
