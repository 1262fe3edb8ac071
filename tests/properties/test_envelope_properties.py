"""The SQS envelope decoder: any body is an envelope or ``PoisonMessage``, nothing
else; an envelope it reads is one fairpost could have written (encoding it again
reads back the same)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from fairpost.mailer.errors import PoisonMessage
from fairpost.mailer.sdk.envelope import Envelope, decode
from tests.properties.strategies import JSON, TEXT, accepted, with_holes

MAIL: dict[str, Any] = {
    "from": "no-reply@acme.example", "to": ["ada@example.com"], "cc": [], "bcc": [], "reply_to": [],
    "subject": "Hi", "text": "Hello", "html": None, "headers": {},
}  # fmt: skip
ENVELOPE: dict[str, Any] = {"v": 1, "job_id": "j1", "tenant": "acme", "created_ms": 1, "mail": MAIL}

BODIES = st.one_of(
    with_holes(ENVELOPE),
    with_holes(MAIL).map(lambda mail: {**ENVELOPE, "mail": mail}),
    with_holes({**ENVELOPE, "v": 2, "content_key": "k"}),
    with_holes({**MAIL, "trace": {"traceparent": "00-x"}}).map(lambda mail: {**ENVELOPE, "mail": mail}),
)


def decoded(body: str) -> Envelope | None:
    return accepted(lambda: decode(body), PoisonMessage)


def holds(envelope: Envelope | None) -> None:
    if envelope is None:
        return
    assert envelope.job_id and envelope.tenant and envelope.mail.recipients >= 1
    assert decode(envelope.encode()) == envelope


@given(TEXT)
def test_any_text_is_an_envelope_or_poison(body: str) -> None:
    holds(decoded(body))


@given(JSON)
def test_any_json_is_an_envelope_or_poison(value: Any) -> None:
    holds(decoded(json.dumps(value)))


@given(BODIES)
@example({**ENVELOPE, "mail": {**MAIL, "headers": [[None, None]]}})  # was read as headers {None: None}
@example({**ENVELOPE, "mail": {**MAIL, "to": "ada@example.com"}})  # was read as to ('a', 'd', 'a', ...)
def test_an_envelope_with_any_field_broken_is_read_or_poison(body: dict[str, Any]) -> None:
    holds(decoded(json.dumps(body)))


@given(st.sampled_from(sorted(ENVELOPE)), JSON)
def test_one_field_of_any_value(field: str, value: Any) -> None:
    holds(decoded(json.dumps({**ENVELOPE, field: value})))
