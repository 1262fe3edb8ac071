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
from pathlib import Path
from typing import Any

import pytest

from fairpost import MailClient
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.sqs_server import SqsServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.redis_cutter import redis_cutter
from tests.support.replicas import (
    accepted,
    application_settings,
    mail,
    make_queue,
    replica_env,
    replicas,
    settled,
    stop_cleanly,
)

pytestmark = [pytest.mark.slow]

TENANT_LIMIT = "3/second"
TRICKLE = ["t1", "t2", "t3"]
BACKLOG = 45
"""The throttled tenant's mail, enqueued at once: some fifteen seconds of its quota."""
CUTS, DOWN, UP = 12, 0.6, 1.2
LONGEST_GAP = 10.0


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
        env = replica_env(
            ses_url=ses.url,
            sqs_url=fifo_sqs_srv.url,
            fairpost={
                "FAIRPOST_REDIS_URL": cutter.url(),
                "FAIRPOST_QUEUE_NAME": f"cuts-{uuid.uuid4().hex[:8]}.fifo",
                "FAIRPOST_GLOBAL_LIMITS": "40/second",
                "FAIRPOST_TENANT_LIMITS": TENANT_LIMIT,
                # A dispatcher claim whose answer is lost leaves its jobs leased until the
                # lease lapses (the dispatcher's own, not the sender's): kept short here.
                "FAIRPOST_DISPATCHER__LEASE_SECONDS": "5",
                "FAIRPOST_SENDER__WAIT_SECONDS": "2",
                "FAIRPOST_SHUTDOWN_GRACE": "3",
            },
        )
        settings = application_settings(env, monkeypatch)
        make_queue(settings, fifo_sqs_srv.url)

        enqueued: dict[str, float] = {}

        def enqueue(tenant: str, mails: list[dict[str, Any]]) -> None:
            asked = time.monotonic()
            for job_id in accepted(functools.partial(client.send_many, tenant, mails)):
                enqueued.setdefault(job_id, asked)

        with replicas(env, tmp_path) as daemons, MailClient(settings) as client:
            enqueue("noisy", [mail("noisy", i) for i in range(BACKLOG)])
            cutter.cut_repeatedly(times=CUTS, down=DOWN, up=UP)
            start = time.monotonic()
            for tick in range(int(CUTS * (DOWN + UP) / 0.5)):
                for tenant in TRICKLE:
                    enqueue(tenant, [mail(tenant, tick)])
                # Pacing the load generator, not waiting for an outcome.
                time.sleep(max(0.0, start + (tick + 1) * 0.5 - time.monotonic()))
            cutter.wait_repeated(timeout=60)
            # Once every job is recorded sent, no message still in SQS can reach SES again.
            wait_for(
                settled(client, enqueued), within=90, what="every accepted job sent or dead", interval=0.5
            )
            states = {i: client.status(i) for i in enqueued}
            stop_cleanly(daemons)

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
