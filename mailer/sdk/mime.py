"""The MIME message a mail becomes when it has attachments (or is too big for an
SQS message): built with the standard library's :mod:`email`, sent to SES v2
as ``Content.Raw``.
"""

from __future__ import annotations

from collections.abc import Iterable
from email import policy
from email.errors import MessageError
from email.message import EmailMessage

from fairpost.mailer.errors import InvalidMail
from fairpost.mailer.sdk.attachments import Attachment
from fairpost.mailer.sdk.list_unsubscribe import folded, is_list_unsubscribe
from fairpost.mailer.sdk.mail import ValidMail

SES_MAX_MESSAGE_BYTES = 40_000_000
"""SES v2's limit on one message, attachments (base64-encoded) included."""


def build_mime(mail: ValidMail, attachments: Iterable[Attachment], *, prefix: str = "") -> bytes:
    """The whole message, CRLF line endings, as SES's ``Content.Raw.Data`` takes it.

    Bcc recipients are not written as a header: SES gets them from ``Destination``.
    No Date or Message-ID: SES adds them when it sends (a scheduled mail is sent
    later than it is built). The mail's headers passed :mod:`.headers` in
    :func:`~fairpost.mailer.sdk.mail.validate`, as on the Simple path.
    """
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
            if not is_list_unsubscribe(name):
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
        # Written as they are (folded, never encoded), before the rest of the header.
        own = b"".join(folded(n, v) for n, v in mail.headers.items() if is_list_unsubscribe(n))
        return own + msg.as_bytes(policy=policy.SMTP)
    except (ValueError, TypeError, MessageError) as exc:
        # A header value the email package cannot write (a malformed Date, say).
        raise InvalidMail(prefix + "headers", f"cannot be written as a MIME message: {exc}") from None
