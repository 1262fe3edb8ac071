"""Where the trace context travels: the payload's last field, up to the SQS body the
sender decodes; bodies without it (untraced, or from an older fairpost) read as before."""

from __future__ import annotations

import json

import pytest

from fairpost.mailer.sdk.compose import stored_payload
from fairpost.mailer.sdk.envelope import (
    CLAIM_CHECK_VERSION,
    Envelope,
    decode,
    encode,
    payload_trace,
    with_trace,
)
from fairpost.mailer.sdk.mail import Mail, validate

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "priority": "high"}


def mail_json(**overrides: object) -> str:
    fields: dict[str, object] = {
        "sender": "app@acme.example",
        "to": ["ada@example.org"],
        "subject": "Reset",
        "text": "hello",
        **overrides,
    }
    return validate(Mail(**fields), max_bytes=1_000_000)[1]  # type: ignore[arg-type]


def test_a_traced_payload_reaches_the_sender_with_its_trace() -> None:
    payload = with_trace(mail_json(), TRACE)
    assert payload_trace(payload) == TRACE
    env = decode(encode("j1", "acme", 1, payload))
    assert env.trace == TRACE
    assert env.mail.subject == "Reset"


def test_a_body_written_without_a_trace_decodes_as_before() -> None:
    payload = mail_json()
    assert payload_trace(payload) is None
    env = decode(encode("j1", "acme", 1, payload))
    assert env.trace is None
    assert env == Envelope("j1", "acme", 1, env.mail)


def test_a_claim_check_carries_its_trace_too() -> None:
    valid, _ = validate(
        Mail(sender="a@acme.example", to=["b@example.org"], subject="s", text="t"), max_bytes=10**6
    )
    payload = with_trace(stored_payload(valid, "fairpost:{fairpost}:content:j1", 1234), TRACE)
    env = decode(encode("j1", "acme", 1, payload))
    assert json.loads(encode("j1", "acme", 1, payload))["v"] == CLAIM_CHECK_VERSION
    assert env.content_key == "fairpost:{fairpost}:content:j1"
    assert env.trace == TRACE


@pytest.mark.parametrize(
    "text",
    [
        ',"trace":{"traceparent":"00-forged"}}',
        '"trace":{"x":"y"}',
    ],
)
def test_a_mails_own_text_is_never_taken_for_its_trace(text: str) -> None:
    payload = mail_json(text=text, headers={"trace": '{"traceparent":"x"}'})
    assert payload_trace(payload) is None
    assert payload_trace(with_trace(payload, TRACE)) == TRACE
    assert decode(encode("j1", "acme", 1, payload)).trace is None


@pytest.mark.parametrize("broken", ['"00-x"', '{"traceparent":1}', "[]", "null"])
def test_a_broken_trace_field_costs_the_mail_its_trace_not_its_send(broken: str) -> None:
    payload = mail_json()[:-1] + ',"trace":' + broken + "}"
    assert payload_trace(payload) is None
    env = decode(encode("j1", "acme", 1, payload))
    assert env.trace is None
    assert env.mail.to == ("ada@example.org",)


def test_an_envelope_with_a_trace_encodes_and_decodes_whole() -> None:
    env = decode(encode("j1", "acme", 1, with_trace(mail_json(), TRACE)))
    assert decode(env.encode()) == env
