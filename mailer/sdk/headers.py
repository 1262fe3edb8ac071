"""The one rule for a mail's headers and subject, on both send paths (SES v2's
``Content.Simple`` and the MIME message sent as ``Content.Raw``).

SES v2 documents a header (``MessageHeader``) as: a name of printable ASCII
without ``:``, at most :data:`MAX_NAME_CHARS` characters; a value of printable
ASCII, 1 to :data:`MAX_VALUE_CHARS` characters. A mail SES would refuse is
refused at ``send`` with an :class:`InvalidMail` naming the field, not queued
to die at SES. The names in :data:`RESERVED_HEADERS` fairpost writes from the
mail's own fields; ``X-SES-*`` are instructions to SES.

A rule for a particular header goes in :func:`check_header`; a rule between
headers, here :func:`check_list_unsubscribe` (the bulk-sender rules for a
notification's own ``List-Unsubscribe``), is run by :func:`check_headers`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fairpost.mailer.errors import InvalidMail

__all__ = [
    "CONTROLS",
    "LIST_UNSUBSCRIBE",
    "LIST_UNSUBSCRIBE_POST",
    "MAX_NAME_CHARS",
    "MAX_VALUE_CHARS",
    "ONE_CLICK",
    "RESERVED_HEADERS",
    "SES_HEADER_PREFIX",
    "UNSUBSCRIBE_RULE",
    "check_header",
    "check_headers",
    "check_list_unsubscribe",
    "check_subject",
    "find_header",
]

MAX_NAME_CHARS = 126
"""SES v2's limit on a header's name."""

MAX_VALUE_CHARS = 870
"""SES v2's limit on a header's value."""

RESERVED_HEADERS = frozenset(
    name.lower()
    for name in (
        "From",
        "To",
        "Cc",
        "Bcc",
        "Reply-To",
        "Subject",
        "MIME-Version",
        "Content-Type",
        "Content-Transfer-Encoding",
        "Content-Disposition",
    )
)
"""Written by fairpost from the mail's own fields (lower case)."""

SES_HEADER_PREFIX = "x-ses-"
"""SES reads headers named so as instructions (configuration set, message tags,
ARNs): a tenant's own could redirect its events or forge the tenant tag."""

_NAME_CHARS = frozenset(chr(c) for c in range(33, 127)) - {":"}
_VALUE_CHARS = frozenset(chr(c) for c in range(32, 127))
CONTROLS = frozenset(chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)))
"""C0, DEL and C1: no header (subject, address, display name) may hold one."""


LIST_UNSUBSCRIBE = "List-Unsubscribe"
LIST_UNSUBSCRIBE_POST = "List-Unsubscribe-Post"
ONE_CLICK = "List-Unsubscribe=One-Click"
"""``List-Unsubscribe-Post``'s one value, and the body of a one-click POST (RFC 8058)."""

UNSUBSCRIBE_RULE = (
    "on notification mail, List-Unsubscribe must name an https:// URI in <...> and come with "
    "List-Unsubscribe-Post: List-Unsubscribe=One-Click (RFC 8058; Gmail's and Yahoo's bulk-sender rules)"
)
_HTTPS_URI = re.compile(r"<https://[^<>\s]+>")


def check_headers(value: object, field_name: str, *, notification: bool = False) -> dict[str, str]:
    """The tenant's headers, each checked by :func:`check_header`, then together by
    :func:`check_list_unsubscribe` (``notification``: the mail is of that stream)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidMail(field_name, "must be a mapping of header name to value")
    headers = {name: check_header(name, header, field_name) for name, header in value.items()}
    check_list_unsubscribe(headers, notification, field_name)
    return headers


def find_header(headers: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """``(name as given, value)`` of a header, its name matched in any case."""
    for given, value in headers.items():
        if given.lower() == name.lower():
            return given, value
    return None


def check_list_unsubscribe(headers: Mapping[str, str], notification: bool, field_name: str) -> None:
    """A notification's own ``List-Unsubscribe``, if it gives one, as the bulk-sender
    rules want it: an https URI, with ``List-Unsubscribe-Post``. Without one, fairpost
    writes its own (:mod:`fairpost.mailer.sdk.list_unsubscribe`); transactional mail
    may carry any."""
    own, post = find_header(headers, LIST_UNSUBSCRIBE), find_header(headers, LIST_UNSUBSCRIBE_POST)
    if not notification or (own is None and post is None):
        return
    name = (own or post or ("", ""))[0]
    if own is None or post is None or _HTTPS_URI.search(own[1]) is None or post[1].strip() != ONE_CLICK:
        raise InvalidMail(f"{field_name}[{name!r}]", UNSUBSCRIBE_RULE)


def check_header(name: object, value: object, field_name: str = "headers") -> str:
    """One header's value, if SES takes the header and it is the tenant's to give."""
    where = f"{field_name}[{name!r}]"
    if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
        raise InvalidMail(where, "a header name is printable ASCII without spaces or ':'")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidMail(where, f"a header name is at most {MAX_NAME_CHARS} characters (SES v2's limit)")
    lower = name.lower()
    if lower in RESERVED_HEADERS:
        raise InvalidMail(where, "is set by fairpost from the mail's own fields (sender, to, subject...)")
    if lower.startswith(SES_HEADER_PREFIX):
        raise InvalidMail(
            where,
            "X-SES-* headers are instructions to SES, not the tenant's to give; fairpost sets "
            "the configuration set and tags itself",
        )
    if not isinstance(value, str):
        raise InvalidMail(where, f"must be a string, got {type(value).__name__}")
    if "\r" in value or "\n" in value:
        raise InvalidMail(where, "must not contain CR or LF (header injection)")
    if not set(value) <= _VALUE_CHARS:
        raise InvalidMail(where, "a header value is printable ASCII (SES v2's rule; no tabs or controls)")
    if not 1 <= len(value) <= MAX_VALUE_CHARS:
        raise InvalidMail(where, f"a header value is 1 to {MAX_VALUE_CHARS} characters (SES v2's limit)")
    return value


def check_subject(value: object, field_name: str) -> str:
    """The subject: any text (SES encodes it) without line breaks or control characters."""
    if not isinstance(value, str):
        raise InvalidMail(field_name, f"must be a string, got {type(value).__name__}")
    if "\r" in value or "\n" in value:
        raise InvalidMail(field_name, "must not contain CR or LF (header injection)")
    if not CONTROLS.isdisjoint(value):
        raise InvalidMail(field_name, "must not contain control characters (NUL, tab, escapes)")
    return value
