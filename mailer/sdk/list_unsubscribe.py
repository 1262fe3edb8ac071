"""The ``List-Unsubscribe`` headers of notification mail (RFC 2369, RFC 8058).

Notification mail gets both headers: ``List-Unsubscribe`` with an https link to
``fairpost unsubscribe-server`` (and a ``mailto:`` address when SES receives
mail for ``FAIRPOST_UNSUBSCRIBE__MAILTO_DOMAIN``), each carrying a signed token
(fairpost.mailer.sdk.unsub_token), and ``List-Unsubscribe-Post:
List-Unsubscribe=One-Click``. Transactional mail gets neither.

An application may give its own instead, on notification mail only as the
bulk-sender rules want it (:func:`fairpost.mailer.sdk.headers.check_list_unsubscribe`,
with the other header rules).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from fairpost.config import Settings
from fairpost.mailer.errors import InvalidMail
from fairpost.mailer.sdk.headers import (
    LIST_UNSUBSCRIBE,
    LIST_UNSUBSCRIBE_POST,
    MAX_VALUE_CHARS,
    ONE_CLICK,
    UNSUBSCRIBE_RULE,
    find_header,
)
from fairpost.mailer.sdk.unsub_token import Token, sign

__all__ = [
    "LIST_UNSUBSCRIBE",
    "LIST_UNSUBSCRIBE_POST",
    "MAILTO_PREFIX",
    "ONE_CLICK",
    "folded",
    "has_own",
    "is_list_unsubscribe",
    "unsubscribe_headers",
]

MAILTO_PREFIX = "u-"
"""What the local part of an unsubscribe address puts before its token."""


def has_own(headers: Mapping[str, str]) -> bool:
    """Whether the application gave its own ``List-Unsubscribe`` (checked in ``validate``)."""
    return find_header(headers, LIST_UNSUBSCRIBE) is not None


def unsubscribe_headers(settings: Settings, tenant: str, address: str, topic: str) -> dict[str, str]:
    """fairpost's own two headers for one recipient of a notification mail."""
    section = settings.unsubscribe
    if not section.keys or not section.base_url:
        raise InvalidMail(
            "stream",
            "notification mail needs List-Unsubscribe: set FAIRPOST_UNSUBSCRIBE__KEYS and "
            "FAIRPOST_UNSUBSCRIBE__BASE_URL, or give your own (" + UNSUBSCRIBE_RULE + ")",
        )
    expires = int(time.time()) + section.token_days * 86400
    token = sign(Token(tenant, address, topic, expires), section.keys[0].get_secret_value().encode())
    value = f"<{section.base_url}/u/{token}>"
    if len(value) > MAX_VALUE_CHARS:
        raise InvalidMail(
            "to",
            f"its unsubscribe link would be {len(value)} characters, over SES's {MAX_VALUE_CHARS} for a "
            "header: shorten FAIRPOST_UNSUBSCRIBE__BASE_URL (the token grows with the address)",
        )
    mailto = f", <mailto:{MAILTO_PREFIX}{token}@{section.mailto_domain}?subject=unsubscribe>"
    # The token is written twice with the mailto: address; RFC 8058 needs the https
    # link alone, so a long address's mail keeps that one (SES refuses a longer value).
    if section.mailto_domain and len(value + mailto) <= MAX_VALUE_CHARS:
        value += mailto
    return {LIST_UNSUBSCRIBE: value, LIST_UNSUBSCRIBE_POST: ONE_CLICK}


def is_list_unsubscribe(name: str) -> bool:
    return name.lower() in (LIST_UNSUBSCRIBE.lower(), LIST_UNSUBSCRIBE_POST.lower())


def folded(name: str, value: str) -> bytes:
    """The header as a MIME message's lines, folded between its URIs, never encoded.

    Python's email package RFC 2047-encodes a word longer than a line
    (``=?utf-8?q?=3Chttps...``), which no mailbox provider reads as a link. A URI
    is one word, so each goes on a line of its own, up to RFC 5322's 998 octets."""
    parts = [p.strip() for p in value.split(",")] if name.lower() == LIST_UNSUBSCRIBE.lower() else [value]
    return (name + ": " + ",\r\n ".join(parts) + "\r\n").encode("ascii")
