"""The demo's webhook receiver and its check, without a run: it verifies deliveries with
the Standard Webhooks library, counts what verified, and the check fails naming what is
missing (the whole run is tests/ops/test_demo_bounce.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from fairpost.mailer.demo.monitor import JobBook
from fairpost.mailer.demo.report import _webhook_check
from fairpost.mailer.demo.scenario import load_scenario
from fairpost.mailer.demo.webhooks import Received, Receiver
from fairpost.mailer.sdk.outcomes.signing import new_secret


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver().start()
    try:
        yield running
    finally:
        running.stop()


def post(url: str, event_id: str, body: str, secret: str) -> int:
    """A delivery signed by the specification's own library (not fairpost's signing)."""
    now = datetime.now(UTC).replace(microsecond=0)
    signature = Webhook(secret).sign(event_id, now, body)
    headers = {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def event(kind: str, job_id: str) -> str:
    return json.dumps({"type": kind, "timestamp": "2030-01-01T00:00:00Z", "data": {"job_id": job_id}})


def test_the_receiver_keeps_what_verifies_and_refuses_the_rest(receiver: Receiver) -> None:
    secret = new_secret()
    receiver.expect("bouncy", "ep_1", secret)
    url = receiver.url("bouncy")
    assert post(url, "evt_1", event("mail.sent", "j1"), secret) == 204
    assert post(url, "evt_1", event("mail.sent", "j1"), secret) == 204  # a retry: one event
    assert post(url, "evt_2", event("mail.bounced", "j1"), secret) == 204
    assert post(url, "evt_3", event("mail.delivered", "j2"), new_secret()) == 400  # another secret
    assert post(receiver.url("nobody"), "evt_4", event("mail.sent", "j3"), secret) == 404

    got = receiver.received()["bouncy"]
    assert (got.deliveries, got.unverified) == (4, 1)
    assert got.by_type() == {"mail.bounced": 1, "mail.sent": 1}
    assert got.sent_jobs == {"j1"}
    assert got.errors and "signature" in got.errors[0].lower()


def book_with(sent: list[str]) -> JobBook:
    book = JobBook()
    book.add("bouncy", sent, 1)
    for job_id in sent:
        book.jobs[job_id].state = "sent"
    return book


def test_the_check_passes_when_every_outcome_arrived() -> None:
    scenario = load_scenario("bounce")
    got = Received(
        "ep_1", deliveries=3, events={"e1": "mail.sent", "e2": "mail.delivered", "e3": "mail.bounced"}
    )
    got.sent_jobs = {"j1"}
    check = _webhook_check(scenario, book_with(["j1"]), {"bouncy": got}, simulated=True)
    assert check.ok is True, check.detail
    assert "mail.sent, mail.delivered, mail.bounced received" in check.detail


def test_the_check_fails_naming_what_did_not_arrive() -> None:
    scenario = load_scenario("bounce")
    nothing = _webhook_check(scenario, book_with(["j1"]), {"bouncy": Received("ep_1")}, simulated=True)
    assert (nothing.ok, nothing.detail) == (False, "no event reached bouncy's endpoint")

    only_sent = Received("ep_1", deliveries=2, unverified=1, events={"e1": "mail.sent"})
    only_sent.sent_jobs = {"j1"}
    check = _webhook_check(scenario, book_with(["j1", "j2"]), {"bouncy": only_sent}, simulated=True)
    assert check.ok is False
    assert check.detail == (
        "1 deliveries to bouncy's endpoint failed verification; "
        "no mail.delivered or mail.bounced reached bouncy's endpoint; "
        "1 of bouncy's sent jobs never had their mail.sent delivered"
    )
