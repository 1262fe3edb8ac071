"""The SDK's checks of a mail's addresses, headers and attachments: any input is
accepted or refused with ``InvalidMail`` (nothing else), and nothing is accepted
that a stricter reader refuses: SES v2's documented header limits, and the
standard library's ``email.headerregistry`` (no defects, one address each)."""

from __future__ import annotations

import re
from email import policy
from email.headerregistry import HeaderRegistry
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from fairpost.mailer.errors import InvalidMail
from fairpost.mailer.sdk.attachments import Attachment, check_attachments
from fairpost.mailer.sdk.headers import RESERVED_HEADERS, check_headers, check_subject
from fairpost.mailer.sdk.mail import Mail, validate
from fairpost.mailer.sdk.mime import build_mime
from tests.properties.strategies import ASCII, TEXT, TRICKY, accepted

HEADERS = HeaderRegistry()
NAMES = st.one_of(ASCII, st.sampled_from(["From", "bcc", "X-SES-TAGS", "List-Unsubscribe", "X-" + "n" * 130]))
VALUES = st.one_of(ASCII, TEXT, st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=900))
ADDRESSES = st.one_of(
    st.emails(),
    TEXT,
    st.builds(lambda name, addr: f"{name} <{addr}>", TEXT, st.emails()),
    st.builds(lambda a, b: f"{a}{b}", st.emails(), st.text(TRICKY, max_size=5)),
)
SES_VALUE = re.compile(r"[\x20-\x7e]{1,870}")
SES_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]{1,126}")


@given(st.dictionaries(NAMES, VALUES, max_size=4))
def test_headers_accepted_are_ones_ses_and_the_email_package_take(headers: dict[str, str]) -> None:
    taken = accepted(lambda: check_headers(headers, "headers"), InvalidMail)
    if taken is None:
        return
    for name, value in taken.items():
        assert SES_NAME.fullmatch(name) and SES_VALUE.fullmatch(value), (name, value)
        assert name.lower() not in RESERVED_HEADERS and not name.lower().startswith("x-ses-")
        parsed = HEADERS(name, value)
        assert not [d for d in parsed.defects if "NonPrintable" in type(d).__name__], parsed.defects


@given(st.one_of(TEXT, st.none(), st.integers()))
def test_a_subject_accepted_has_no_line_break_or_control(subject: Any) -> None:
    taken = accepted(lambda: check_subject(subject, "subject"), InvalidMail)
    if taken is not None:
        assert not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in taken)


@given(ADDRESSES)
@example("\x1f<ada@example.com>")  # a control character in the display name was accepted
def test_an_address_accepted_is_one_the_email_package_reads_as_one(address: str) -> None:
    mail = Mail(sender="no-reply@acme.example", to=address, subject="Hi", text="Hello")
    found = accepted(lambda: validate(mail, max_bytes=10**6), InvalidMail)
    if found is None:
        return
    valid, _ = found
    [address_taken] = valid.to
    parsed = policy.default.header_factory("To", address_taken)
    assert len(parsed.addresses) == 1 and not parsed.defects, (address, address_taken, parsed.defects)
    assert parsed.addresses[0].addr_spec.isascii()
    # And the MIME path writes it: what was accepted is sendable both ways.
    build_mime(valid, ())


@given(
    st.lists(
        st.builds(
            Attachment,
            st.one_of(TEXT, st.just("report.pdf")),
            st.one_of(ASCII, st.sampled_from(["application/pdf", "text/plain", "image/png; x=1"])),
            st.one_of(st.binary(max_size=64), st.just(b"")),
        ),
        max_size=3,
    )
)
def test_attachments_accepted_have_safe_names_and_readable_types(attachments: list[Attachment]) -> None:
    taken = accepted(lambda: check_attachments(attachments, "attachments"), InvalidMail)
    if taken is None:
        return
    for item in taken:
        assert 1 <= len(item.filename) <= 255 and item.filename.strip()
        assert not any(ord(c) < 32 or c in "/\\" for c in item.filename)
        content_type: Any = HEADERS("Content-Type", item.content_type)  # a ContentTypeHeader
        assert not content_type.defects, (item.content_type, content_type.defects)
        assert f"{content_type.maintype}/{content_type.subtype}" == item.content_type
