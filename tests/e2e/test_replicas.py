"""Two daemon processes on one Redis and one FIFO queue (LocalStack: moto lets
two receivers share a group, docs/design.md "What the emulators get wrong"),
a bursting tenant and a steady trickle.

Checked at the SES side (the recording server in mailer/testing/ses_server.py):
every mail delivered exactly once, no sliding window over its limit globally or
per tenant, and the trickle's latency untouched by the burst.
"""

from __future__ import annotations

import bisect
import collections
import time
import uuid
from pathlib import Path

import pytest

from fairpost import MailClient
from fairpost.mailer.testing.localstack import LocalStackServer
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.replicas import application_settings, make_queue, replica_env, replicas, stop_cleanly

pytestmark = [pytest.mark.slow, pytest.mark.localstack]

GLOBAL = "30/second"
TENANT = "6/second"
QUIET = ["q1", "q2", "q3", "q4"]


def test_two_replicas_deliver_exactly_once_and_never_over_quota(
    redis_url: str, localstack_srv: LocalStackServer, ses: SesServer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    env = replica_env(
        ses_url=ses.url,
        sqs_url=localstack_srv.url,
        fairpost={
            "FAIRPOST_REDIS_URL": redis_url,
            "FAIRPOST_QUEUE_NAME": f"replicas-{uuid.uuid4().hex[:8]}.fifo",
            "FAIRPOST_GLOBAL_LIMITS": GLOBAL,
            "FAIRPOST_TENANT_LIMITS": TENANT,
            "FAIRPOST_INFLIGHT_CAP": "12",
            "FAIRPOST_SENDER__WAIT_SECONDS": "2",
            "FAIRPOST_SHUTDOWN_GRACE": "3",
        },
    )
    settings = application_settings(env, monkeypatch)
    make_queue(settings, localstack_srv.url)

    enqueued_at: dict[str, float] = {}
    with replicas(env, tmp_path) as daemons, MailClient(settings) as client:
        start = time.monotonic()
        # The burst: 10x the tenant's per-second quota at once.
        for job_id in client.send_many(
            "noisy", [{"sender": "app@example.com", "to": [f"n{i}@example.org"], "subject": "n", "text": "n"}
                      for i in range(60)]
        ):  # fmt: skip
            enqueued_at[job_id] = time.monotonic()
        # The trickle: each quiet tenant sends one mail every half second, well
        # within its own quota; q1's mails go to two people each.
        quiet_ids: list[str] = []
        for tick in range(12):
            for tenant in QUIET:
                to = [f"{tenant}-{tick}-{r}@example.org" for r in range(2 if tenant == "q1" else 1)]
                job_id = client.send(tenant, sender="app@example.com", to=to, subject="q", text="q")
                enqueued_at[job_id] = time.monotonic()
                quiet_ids.append(job_id)
            # Pacing the load generator, not waiting for an outcome.
            time.sleep(max(0.0, start + (tick + 1) * 0.5 - time.monotonic()))
        wait_for(lambda: ses.sent_count >= len(enqueued_at), within=60, what="every mail at SES")
        # Stop both replicas cleanly: after that no duplicate can still arrive.
        stop_cleanly(daemons)

    delivered = collections.Counter(m.job_id for m in ses.sent)
    assert set(delivered) == set(enqueued_at), "lost or unknown mail"
    assert max(delivered.values()) == 1, "a mail was delivered twice"
    assert ses.max_in_window(1.0) <= 30
    by_tenant = ses.max_in_window_by(1.0, key=lambda m: m.tag("fairpost-tenant"))
    assert max(by_tenant.values()) <= 6, by_tenant
    arrival = {m.job_id: m.monotonic for m in ses.sent}
    # A quiet mail did not wait behind the burst: fewer than two seconds' worth of
    # the noisy tenant's quota (12 of its mails) reached SES between its enqueue and
    # its arrival. Measured against the noisy tenant's own pace, not a clock a
    # loaded machine can use up: a stall holds both back alike.
    quiet = set(quiet_ids)
    noisy_at = sorted(arrival[j] for j in enqueued_at if j not in quiet)
    passed = max(
        bisect.bisect_left(noisy_at, arrival[j]) - bisect.bisect_right(noisy_at, enqueued_at[j])
        for j in quiet_ids
    )
    assert passed < 12, f"{passed} of the noisy tenant's mails went out while a quiet one waited"
    noisy_done = noisy_at[-1] - start
    assert noisy_done >= 60 / 6 - 1.5, "the noisy tenant went faster than its quota allows"
