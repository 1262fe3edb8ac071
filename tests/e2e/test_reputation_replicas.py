"""The reputation guard across real daemon processes: two replicas, five tenants, one
whose list bounces one address in ten. SES is the recording server; its mailbox
simulator publishes each bounce, SNS-wrapped, to the events queue on moto, which
both replicas read.

Checked at the SES side: the bouncing tenant is paused before its bounce rate over
its last 200 sends passes the threshold (4 %: 8 of 200) by more than one mail, and
the four others are never queued behind its backlog.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis

from fairpost import MailClient
from fairpost.mailer.cli import main
from fairpost.mailer.ops.queue_setup import init_events_queue, init_queue
from fairpost.mailer.quota.reputation import GuardState
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support import SQS_BATCH, overtaken_by
from tests.support.replicas import application_settings, replica_env, replicas

pytestmark = [pytest.mark.slow]

OTHERS = ["q1", "q2", "q3", "q4"]


def test_one_tenant_of_five_bouncing_is_paused_in_time_and_the_others_are_not_delayed(
    redis_url: str, aws_env: str, ses: SesServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = replica_env(
        ses_url=ses.url,
        aws_url=aws_env,
        fairpost={
            "FAIRPOST_REDIS_URL": redis_url,
            "FAIRPOST_EVENTS_QUEUE_NAME": "fairpost-ses-events",
            "FAIRPOST_GLOBAL_LIMITS": "100/second",
            "FAIRPOST_TENANT_LIMITS": "10/second",
            "FAIRPOST_SENDER__WAIT_SECONDS": "1",
            "FAIRPOST_SHUTDOWN_GRACE": "3",
        },
    )
    settings = application_settings(env, monkeypatch)
    sqs = boto3.client("sqs")
    init_queue(sqs, settings)
    events_url, _ = init_events_queue(sqs, settings)
    sink = EventSink(sqs, events_url, envelope="sns")
    ses.events = sink
    mail = {"sender": "app@example.com", "subject": "s", "text": "t"}
    try:
        with replicas(env, tmp_path) as daemons, MailClient(settings) as client:
            bouncy_jobs = client.send_many(
                "bouncy",
                [
                    {
                        **mail,
                        "to": [f"bounce+{i}@simulator.amazonses.com" if i % 10 == 9 else f"u{i}@example.org"],
                    }
                    for i in range(400)
                ],
            )
            overtaken: list[int] = []
            """For each of the others' mails: bouncy's mails SES got while it waited."""
            deadline = time.monotonic() + 90
            while not _paused(redis_url) and time.monotonic() < deadline:
                started, since = time.monotonic(), len(ses.sent)
                jobs = [client.send(t, to=["ok@example.org"], **mail) for t in OTHERS]  # type: ignore[arg-type]
                wait_for(partial(_all_sent, client, jobs), within=10, what="the others' mail")
                overtaken += [overtaken_by(ses.sent, "bouncy", since, job) for job in jobs]
                time.sleep(max(0.0, started + 0.5 - time.monotonic()))  # the others' pace, not a wait
            assert _paused(redis_url), "the bouncing tenant was never paused"
            at_pause = [m for m in ses.sent if m.tag("fairpost-tenant") == "bouncy"]
            # The other replica may be mid-send when the pause lands: every replica has
            # taken the pause from its overrides (it logs it), and no mail of bouncy is
            # still in an SES call (its sending marker). A decision that checked the
            # pause before its replica saw it claims its marker within a round trip.
            sending = [MailKeys(settings.key_prefix).sending(job) for job in bouncy_jobs]

            def settled() -> bool:
                seen = all(_saw_pause(daemon.log_records(), "bouncy") for daemon in daemons)
                with redis.Redis.from_url(redis_url) as r:
                    return seen and r.exists(*sending) == 0

            wait_for(settled, within=30, what="every replica to hold bouncy, and its SES calls to end")
            bouncy = [m for m in ses.sent if m.tag("fairpost-tenant") == "bouncy"]
            last = bouncy[-200:]
            bounced = sum(1 for m in last if m.to[0].startswith("bounce+"))
            assert bounced <= 0.04 * 200 + 1, (bounced, len(at_pause), len(bouncy))
            assert len(bouncy) < 400, "the pause held nothing back"
            # The others never wait behind bouncy's backlog: what overtakes them is at most
            # what bouncy had in flight already (its cap) and one receive's batch.
            assert max(overtaken) <= settings.inflight_cap_for("bouncy") + SQS_BATCH, overtaken
            assert main(["tenant", "resume", "bouncy"]) == 0
            assert not _paused(redis_url)
    finally:
        sink.close()


def _address(i: int) -> str:
    """One address in ten bounces, each a different one (suppression cannot help)."""
    return f"bounce+{i}@simulator.amazonses.com" if i % 10 == 9 else f"u{i}@example.org"


def _saw_pause(records: list[dict[str, Any]], tenant: str) -> bool:
    """Whether a replica's log says its live overrides hold ``tenant`` paused."""
    return any(r.get("msg") == "tenant paused by an operator" and r.get("tenant") == tenant for r in records)


def _all_sent(client: MailClient, jobs: list[str]) -> bool:
    return all(client.status(j).state == "sent" for j in jobs)


def _paused(redis_url: str) -> bool:
    with redis.Redis.from_url(redis_url) as client:
        state = GuardState.from_json(client.hget(MailKeys().guard(), "bouncy"))
    return state is not None and state.level == "paused"
