"""The dispatcher names no job kind: its modules and scripts say nothing of mail.

Mail's keys, its send marker and its scripts live in ``fairpost.mailer`` and
reach the dispatcher through the hooks of its ``Keys`` (docs/design.md, "Job
kinds"); import-linter forbids the import. This test reads the words: a comment
or a message that speaks of mail is a sign that mail's logic crept back in.
"""

from __future__ import annotations

import re
from pathlib import Path

import fairpost.dispatcher

DISPATCHER = Path(fairpost.dispatcher.__file__).parent

MAIL_WORDS = re.compile(
    r"\b(e-?mails?|mails?|mailer|ses|sending|senders?|smtp|recipients?|unsubscri\w*|webhooks?"
    r"|suppress(ed|ion)|bounces?|complaints?|warm-?up|reputation|notifications?)\b",
    re.IGNORECASE,
)
"""Mail's words. Not in the list, as the dispatcher's own: ``sent`` (the final state
of a job done, kept in every record written so far), ``tenant``, ``hold``."""

ALLOWED = {
    (
        "redis_memory.py",
        'f"maxmemory-policy {policy} evicts keys with a TTL at maxmemory; new mail is refused "',
    ): "the operator's verdict on the eviction policy, quoted by fairpost doctor and "
    "asserted by tests/ops/test_doctor.py",
}
"""(file, the line's text) → why the line may name mail."""


def sources() -> list[Path]:
    return sorted([*DISPATCHER.glob("*.py"), *DISPATCHER.glob("*.lua")])


def test_the_dispatcher_names_nothing_of_mail() -> None:
    found = []
    allowed_seen = set()
    for path in sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if MAIL_WORDS.search(line) is None:
                continue
            key = (path.name, line.strip())
            if key in ALLOWED:
                allowed_seen.add(key)
            else:
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
    # An allowance no line needs any more goes too.
    assert allowed_seen == set(ALLOWED)


def test_the_words_are_found_where_they_are() -> None:
    # The check itself can fail: it finds each word in a line that has it.
    for line in ("-- the sending marker", "a mail's JSON", "SES events", "notification mail", "webhooks"):
        assert MAIL_WORDS.search(line), line
    for line in ("the job was sent", "sessions", "message", "mailbox", "a tenant's hold"):
        assert MAIL_WORDS.search(line) is None, line
    assert len(sources()) > 40
