"""One header rule for both send paths (the Simple one, and the MIME message of a
mail with attachments): what SES v2 would refuse is refused at ``send``, as an
``InvalidMail`` naming the field, and nothing is written.

SES v2's documented limits (``MessageHeader``): a name is printable ASCII without
``:``, at most 126 characters; a value printable ASCII, 1 to 870 characters. The
names fairpost writes from the mail's own fields (From, To, Bcc, Content-Type...)
are not the tenant's to give, on either path.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from fairpost import Attachment, InvalidMail, MailClient
from fairpost.mailer.sdk.headers import MAX_NAME_CHARS, MAX_VALUE_CHARS, RESERVED_HEADERS

GOOD: dict[str, Any] = {
    "sender": "no-reply@acme.example",
    "to": ["ada@example.com"],
    "subject": "Hi",
    "text": "Hello",
}
ATTACHED = {"attachments": [Attachment("a.txt", "text/plain", b"hello")]}
PATHS = {"simple": {}, "mime": ATTACHED}


def refused(client: MailClient, redis_client: redis.Redis, **changes: Any) -> InvalidMail:
    with pytest.raises(InvalidMail) as info:
        client.send("acme", **{**GOOD, **changes})
    assert redis_client.dbsize() == 0, "a refused mail wrote to Redis"
    return info.value


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "name", ["From", "bcc", "To", "Cc", "Reply-To", "Subject", "Content-Type", "MIME-Version",
             "Content-Transfer-Encoding", "Content-Disposition"],
)  # fmt: skip
def test_a_reserved_name_is_refused_on_both_paths(
    client: MailClient, redis_client: redis.Redis, path: str, name: str
) -> None:
    error = refused(client, redis_client, headers={name: "x@example.com"}, **PATHS[path])
    assert error.field == f"headers[{name!r}]" and "set by fairpost" in error.rule
    assert name.lower() in RESERVED_HEADERS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("Zoë", "printable ASCII"),
        ("a\x00b", "printable ASCII"),
        ("a\tb", "printable ASCII"),
        ("a\x7fb", "printable ASCII"),
        ("", "1 to 870"),
        ("v" * (MAX_VALUE_CHARS + 1), "1 to 870"),
        ("v" * 100_000, "1 to 870"),
        ("a\r\nBcc: eve@example.com", "CR or LF"),
    ],
)
def test_a_value_ses_would_refuse_is_refused_naming_the_header(
    client: MailClient, redis_client: redis.Redis, path: str, value: str, rule: str
) -> None:
    error = refused(client, redis_client, headers={"X-Name": value}, **PATHS[path])
    assert error.field == "headers['X-Name']" and rule in error.rule


@pytest.mark.parametrize("path", PATHS)
def test_a_name_over_126_characters_is_refused(
    client: MailClient, redis_client: redis.Redis, path: str
) -> None:
    name = "X-" + "n" * (MAX_NAME_CHARS - 1)
    error = refused(client, redis_client, headers={name: "v"}, **PATHS[path])
    assert error.field == f"headers[{name!r}]" and "126" in error.rule


@pytest.mark.parametrize("subject", ["a\x00b", "a\x1bb", "a\tb", "a\x7fb", "a\x85b"])
def test_a_control_character_in_the_subject_is_refused(
    client: MailClient, redis_client: redis.Redis, subject: str
) -> None:
    error = refused(client, redis_client, subject=subject)
    assert error.field == "subject" and "control characters" in error.rule


@pytest.mark.parametrize("path", PATHS)
def test_headers_at_the_limits_and_a_unicode_subject_are_taken(
    client: MailClient, redis_client: redis.Redis, path: str
) -> None:
    headers = {"X-" + "n" * (MAX_NAME_CHARS - 2): "v" * MAX_VALUE_CHARS, "X-Space": "a b ~!"}
    job_id = client.send("acme", **{**GOOD, "subject": "Grüße", "headers": headers, **PATHS[path]})
    assert client.status(job_id).tenant_id == "acme"
