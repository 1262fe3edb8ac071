"""Attachments: the files a mail carries, checked before anything is written."""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fairpost.mailer.errors import InvalidMail

_CONTENT_TYPE = re.compile(r"[A-Za-z0-9!#$&^_.+-]{1,127}/[A-Za-z0-9!#$&^_.+-]{1,127}")


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
