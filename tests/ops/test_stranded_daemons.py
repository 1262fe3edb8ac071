"""Nothing stranded, with real daemon processes: the queue is purged under
jobs already handed to SQS, and every one of them is still sent, once."""

from __future__ import annotations

import boto3
import pytest

from fairpost import MailClient
from fairpost.mailer.testing.wait import wait_for
from tests.support.operator import Ops

pytestmark = pytest.mark.slow


def test_jobs_purged_from_sqs_are_sent_by_real_daemons(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stranded after 1 (in-flight TTL) + 5 (visibility) + 1 (longest retry delay) = 7 s.
    monkeypatch.setenv("FAIRPOST_DISPATCHER__INFLIGHT_TTL_SECONDS", "1")
    monkeypatch.setenv("FAIRPOST_SENDER__VISIBILITY_TIMEOUT", "5")
    monkeypatch.setenv("FAIRPOST_SENDER__BACKOFF_MAX_SECONDS", "1")
    with MailClient() as client, ops.daemon(replica="d1", role="dispatcher") as dispatcher:
        ids = [
            client.send(f"t{i % 2}", sender="app@example.com", to=["ada@example.org"], subject="s", text="t")
            for i in range(5)
        ]
        wait_for(
            lambda: {client.status(i).state for i in ids} == {"dispatched"}, within=20, what="all in SQS"
        )
        url = boto3.client("sqs").get_queue_url(QueueName="fairpost-mail.fifo")["QueueUrl"]
        boto3.client("sqs").purge_queue(QueueUrl=url)
        # The reconciler (in d1) acts once a sender replica is alive.
        with ops.daemon(replica="s1", role="sender"):
            wait_for(lambda: {client.status(i).state for i in ids} == {"sent"}, within=60, what="all sent")
        assert dispatcher.logged("handed to SQS again")
    assert sorted(m.job_id or "" for m in ops.ses.sent) == sorted(ids), "each job sent exactly once"
    assert ops.stats()["reconciled"] == {"handed_again": 5, "dead": 0}
