"""The parsers of #42's outside input: an unsubscribe token from a URL or a mail
address (whatever a link scanner, a mailbox provider or a forger sends), and SES's
receipt notification. Each answers what it documents or its one refusal, nothing
else; a token verifies only under the key that signed it."""

from __future__ import annotations

import json
from typing import Any, cast

from hypothesis import example, given
from hypothesis import strategies as st

from fairpost.config import Settings
from fairpost.config.tenant_id import is_valid_tenant_id
from fairpost.mailer.daemon.ses_events import parse_event
from fairpost.mailer.daemon.unsubscriber import Unsubscriber
from fairpost.mailer.errors import InvalidToken
from fairpost.mailer.sdk.unsub_token import Token, sign, verify
from fairpost.mailer.testing.ses_publishing import received_record
from tests.properties.strategies import JSON, TEXT, accepted, with_holes
from tests.properties.test_ses_event_properties import holds, sns

KEY, OTHER_KEY = b"k" * 40, b"o" * 40
NOW = 1_800_000_000
TENANTS = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True).filter(is_valid_tenant_id)
TOPICS = st.from_regex(r"[a-z0-9_-]{1,32}", fullmatch=True)
ADDRESSES = st.emails()


@given(TEXT)
@example("")
@example("a" * 7)
def test_any_text_is_a_token_or_invalid_token(text: str) -> None:
    token = accepted(lambda: verify(text, [KEY], NOW), InvalidToken)
    # A token that verifies was signed with the key: by chance only if the text is one.
    assert token is None or sign(token, KEY) == text.lower().rstrip("=")


@given(TENANTS, ADDRESSES, TOPICS, st.integers(min_value=0, max_value=2**32 - 1))
def test_a_signed_token_verifies_as_itself_and_under_no_other_key(
    tenant: str, address: str, topic: str, expires: int
) -> None:
    token = Token(tenant, address, topic, expires)
    text = sign(token, KEY)
    assert text == text.lower() and text.isalnum()  # a URL path segment, a local part
    if expires >= NOW:
        assert verify(text, [OTHER_KEY, KEY], NOW) == token
        assert verify(text.upper(), [KEY], NOW) == token  # case may not survive in mail
    else:
        assert accepted(lambda: verify(text, [KEY], NOW), InvalidToken) is None
    assert accepted(lambda: verify(text, [OTHER_KEY], NOW), InvalidToken) is None


UNSUBSCRIBER = Unsubscriber(
    Settings(unsubscribe={"keys": [KEY.decode()], "mailto_domain": "unsub.example.com"}),
    cast(Any, None),  # mailto_token reads no Redis
)


@given(TEXT)
@example("u-@unsub.example.com")
@example("U-AAAA@UNSUB.EXAMPLE.COM")
def test_any_recipient_address_is_a_token_or_none(address: str) -> None:
    found = UNSUBSCRIBER.mailto_token(address)
    assert found is None or isinstance(found, Token)


@given(with_holes(received_record("ada@example.org", ["u-x@unsub.example.com"])), JSON)
def test_a_receipt_notification_with_any_field_broken_is_an_event_or_a_value_error(
    record: dict[str, Any], message_id: Any
) -> None:
    holds(accepted(lambda: parse_event(json.dumps(record)), ValueError))
    holds(accepted(lambda: parse_event(sns(record, message_id)), ValueError))
