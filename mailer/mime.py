"""Attachments, and the MIME message a mail becomes when it has some (or is too
big for an SQS message): built with the standard library's :mod:`email`, sent
to SES v2 as ``Content.Raw``.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Iterable
from dataclasses import dataclass
from email import policy
from email.errors import MessageError
from email.message import EmailMessage
from pathlib import Path
from typing import TYPE_CHECKING

from mailer.errors import InvalidMail

if TYPE_CHECKING:
    from mailer.mail import ValidMail

SES_MAX_MESSAGE_BYTES = 40_000_000
"""SES v2's limit on one message, attachments (base64-encoded) included."""

_CONTENT_TYPE = re.compile(r"[A-Za-z0-9!#$&^_.+-]{1,127}/[A-Za-z0-9!#$&^_.+-]{1,127}")
_RESERVED_HEADERS = frozenset(
    h.lower()
    for h in (
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


@dataclass(frozen=True)
class Attachment:
    """A file sent with a mail: ``Attachment("report.pdf", "application/pdf", data)``."""

    filename: str
    content_type: str
    data: bytes

    @classmethod
    def from_path(cls, path: str | Path, content_type: str | None = None) -> Attachment:
        """Read a file; the content type is guessed from its name unless given."""
        path = Path(path)
        guessed = content_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return cls(path.name, guessed, path.read_bytes())


def check_attachments(value: object, field_name: str) -> tuple[Attachment, ...]:
    """The attachments, checked; raises :class:`InvalidMail` naming the bad one."""
    if value is None:
        return ()
    if isinstance(value, Attachment | str | bytes) or not isinstance(value, Iterable):
        raise InvalidMail(field_name, "must be a list of mailer.Attachment")
    out = []
    for i, item in enumerate(value):
        where = f"{field_name}[{i}]"
        if not isinstance(item, Attachment):
            raise InvalidMail(where, f"must be a mailer.Attachment, got {type(item).__name__}")
        name = item.filename
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise InvalidMail(where + ".filename", "must be a non-empty string of at most 255 characters")
        if any(ord(c) < 32 or c in "/\\" for c in name):
            raise InvalidMail(where + ".filename", "must not contain control characters, '/' or '\\'")
        if not isinstance(item.content_type, str) or not _CONTENT_TYPE.fullmatch(item.content_type):
            raise InvalidMail(where + ".content_type", f"must be a MIME type such as application/pdf, got "
                              f"{item.content_type!r}")  # fmt: skip
        if not isinstance(item.data, bytes | bytearray | memoryview):
            raise InvalidMail(where + ".data", f"must be bytes, got {type(item.data).__name__}")
        out.append(Attachment(name, item.content_type.lower(), bytes(item.data)))
    return tuple(out)


def build_mime(mail: ValidMail, attachments: Iterable[Attachment], *, prefix: str = "") -> bytes:
    """The whole message, CRLF line endings, as SES's ``Content.Raw.Data`` takes it.

    Bcc recipients are not written as a header: SES gets them from ``Destination``.
    No Date or Message-ID: SES adds them when it sends (a scheduled mail is sent
    later than it is built).
    """
    for name in mail.headers:
        if name.lower() in _RESERVED_HEADERS:
            raise InvalidMail(f"{prefix}headers[{name!r}]", "is set by fairpost from the mail's own fields")
    try:
        msg = EmailMessage(policy=policy.SMTP)
        msg["From"] = mail.sender
        if mail.to:
            msg["To"] = ", ".join(mail.to)
        if mail.cc:
            msg["Cc"] = ", ".join(mail.cc)
        if mail.reply_to:
            msg["Reply-To"] = ", ".join(mail.reply_to)
        msg["Subject"] = mail.subject
        for name, value in mail.headers.items():
            msg[name] = value
        if mail.text and mail.html:
            msg.set_content(mail.text)
            msg.add_alternative(mail.html, subtype="html")
        elif mail.text:
            msg.set_content(mail.text)
        else:
            msg.set_content(mail.html or "", subtype="html")
        for attachment in attachments:
            maintype, subtype = attachment.content_type.split("/", 1)
            msg.add_attachment(
                attachment.data, maintype=maintype, subtype=subtype, filename=attachment.filename
            )
        return msg.as_bytes(policy=policy.SMTP)
    except (ValueError, TypeError, MessageError) as exc:
        # A header value the email package cannot write (a malformed Date, say).
        raise InvalidMail(prefix + "headers", f"cannot be written as a MIME message: {exc}") from None
