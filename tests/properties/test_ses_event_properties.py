"""The SES event parser (raw, SNS-wrapped and EventBridge-wrapped SQS bodies):
whatever a body holds, it answers an event or ``ValueError``, nothing else; an
event it answers has the ids a Redis key may be built from, and a diagnostic
with no address left in it."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from fairpost.config.tenant_id import is_valid_tenant_id
from fairpost.mailer.daemon.ses_events import SesEvent, parse_event
from tests.properties.strategies import JSON, TEXT, accepted, with_holes

ID = re.compile(r"[\x21-\x7e]{1,200}")

BOUNCE: dict[str, Any] = {
    "eventType": "Bounce",
    "mail": {"messageId": "0100-abc", "tags": {"fairpost-job-id": ["j1"], "fairpost-tenant": ["acme"]}},
    "bounce": {
        "bounceType": "Permanent",
        "bounceSubType": "General",
        "bouncedRecipients": [
            {"emailAddress": "ada@example.org", "diagnosticCode": "smtp; 550 ada@example.org"}
        ],
        "feedbackId": "fb-1",
    },
}

EVENTS = st.one_of(
    with_holes(BOUNCE),
    with_holes(BOUNCE).map(lambda e: {**e, "mail": with_mail(e.get("mail"))}),
    st.dictionaries(st.sampled_from(["eventType", "notificationType", "mail", "bounce", "complaint",
                                     "delivery", "reject", "deliveryDelay"]), JSON),
)  # fmt: skip


def with_mail(mail: Any) -> Any:
    return mail if not isinstance(mail, dict) else {**mail, "messageId": mail.get("messageId")}


def sns(event: Any, message_id: Any = "sns-1") -> str:
    return json.dumps({"Type": "Notification", "MessageId": message_id, "Message": json.dumps(event)})


def eventbridge(event: Any) -> str:
    return json.dumps({"source": "aws.ses", "detail-type": "x", "id": "eb-1", "detail": event})


def parsed(body: str) -> SesEvent | None:
    return accepted(lambda: parse_event(body), ValueError)


def holds(event: SesEvent | None) -> None:
    if event is None:
        return
    assert ID.fullmatch(event.message_id) and ID.fullmatch(event.event_id)
    assert event.job_id is None or ID.fullmatch(event.job_id)
    assert event.tenant is None or is_valid_tenant_id(event.tenant)
    assert all(isinstance(r, str) for r in event.recipients)
    if event.diagnostic is not None:
        assert len(event.diagnostic) <= 500
        assert not re.search(r"\w@\w", event.diagnostic), event.diagnostic  # no address left
        assert not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in event.diagnostic)


@given(TEXT)
def test_any_text_is_an_event_or_a_value_error(body: str) -> None:
    holds(parsed(body))


@given(JSON)
def test_any_json_is_an_event_or_a_value_error(value: Any) -> None:
    holds(parsed(json.dumps(value)))
    holds(parsed(sns(value)))
    holds(parsed(eventbridge(value)))


@given(EVENTS, JSON)
def test_events_with_any_field_broken_raw_or_wrapped(event: dict[str, Any], message_id: Any) -> None:
    raw = parsed(json.dumps(event))
    holds(raw)
    wrapped = parsed(sns(event, message_id))
    holds(wrapped)
    holds(parsed(eventbridge(event)))
    # Wrapping changes at most the event's id, never whether or what it reads.
    assert (raw is None) == (wrapped is None) or not ID.fullmatch(str(message_id)[:200])
    if raw is not None and wrapped is not None:
        same = (wrapped.kind, wrapped.message_id, wrapped.recipients)
        assert (raw.kind, raw.message_id, raw.recipients) == same


@given(st.text(max_size=300))
@example("0@)")
@example("Boss <boss@acme.example>")
def test_any_diagnostic_is_stored_without_its_address(diagnostic: str) -> None:
    event = {**BOUNCE, "bounce": {**BOUNCE["bounce"], "bouncedRecipients": [
        {"emailAddress": "ada@example.org", "diagnosticCode": diagnostic + " ada@example.org"}]}}  # fmt: skip
    found = parse_event(json.dumps(event))
    holds(found)
    assert found.diagnostic is None or "ada@example.org" not in found.diagnostic
