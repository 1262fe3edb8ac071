"""SES's texts, made safe to store, log and print: ``redact``.

It runs on SES diagnostics and error texts, on the event loop, and the texts
come from outside: whatever their length, the work is bounded (the text is cut
before anything is searched, and the address pattern starts a match only where
a word starts, so it cannot backtrack across a long word again and again); no
recipient address survives, not even in part where the cut goes through one;
and no control character (terminal escapes, C0 and C1) reaches a log, a job
record or an operator's terminal.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.ses import classify, redact
from fairpost.mailer.daemon.ses_events import parse_event

LONG = 200_000
MAX_OUT = 500


class RecordingPattern:
    """Stands in for the address pattern: records what it is given, substitutes nothing."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def sub(self, repl: str, string: str) -> str:
        self.lengths.append(len(string))
        return string


def test_the_text_is_cut_before_the_addresses_are_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = RecordingPattern()
    monkeypatch.setattr(ses, "_ADDRESS", pattern)
    out = redact("x" * LONG)
    assert pattern.lengths, "redact no longer searches for addresses"
    # Bounded by the output's length and one address, not by the input's.
    assert max(pattern.lengths) <= 2 * MAX_OUT, pattern.lengths
    assert len(out) <= MAX_OUT


def test_the_address_pattern_starts_a_match_only_where_a_word_starts() -> None:
    # What makes it linear: from inside a word the pattern fails at once, so no
    # character is scanned from more than one start (the old pattern rescanned a
    # word without '@' from each of its characters: quadratic).
    text = "x" * 50 + "@example.org"
    assert ses._ADDRESS.search(text, 10) is None
    assert ses._ADDRESS.search(text, 0) is not None
    assert ses._ADDRESS.sub("<address>", "see ada@example.org, <bob@example.net>") == (
        "see <address>, <<address>>"
    )


@pytest.mark.timeout(30)  # a safety net only: the assertions above and below are the test
@pytest.mark.parametrize(
    "text",
    [
        "x" * LONG,
        "ada@example.org " + "y" * LONG,
        ("word " * (LONG // 5)) + "ada@example.org",
        "a@" * (LONG // 2),
        "\x1b[31m" * (LONG // 5),
    ],
    ids=["one-word", "address-then-one-word", "many-words", "at-signs", "escapes"],
)
def test_a_very_long_text_comes_back_short_and_masked(text: str) -> None:
    out = redact(text)
    assert len(out) <= MAX_OUT
    assert "ada" not in out
    assert not re.search(r"\w@\w", out), out[:80]
    assert "\x1b" not in out


def test_a_short_text_keeps_its_words() -> None:
    assert redact("550 5.1.1 <ada@example.org>: user unknown") == "550 5.1.1 <<address>>: user unknown"


@pytest.mark.parametrize(
    ("text", "out"),
    [
        (
            "Message rejected: Boss <boss@acme.example> is suppressed",
            "Message rejected: <address> is suppressed",
        ),
        ('to "Ada Lovelace" <ada@example.org>: refused', "to <address>: refused"),
        ('to "Lovelace, Ada" <ada@example.org>, "Bob" <b@x.example>', "to <address>, <address>"),
        ("550 5.1.1 Grace Brewster Hopper <g@example.org> unknown", "550 5.1.1 <address> unknown"),
        ("Name=Ada Lovelace <ada@example.org>", "Name=<address>"),
        ("550 5.1.1 <ada@example.org>: user unknown", "550 5.1.1 <<address>>: user unknown"),
    ],
)
def test_display_names_go_with_their_address(text: str, out: str) -> None:
    assert redact(text) == out


@pytest.mark.parametrize("local", ["s" * 30, "secret" * 10 + "x", "secret.agent+tag"])
def test_no_part_of_an_address_survives_wherever_the_cut_falls(local: str) -> None:
    # Long addresses before it shrink when masked, so text from near the cut
    # reaches the output: an address the cut goes through must not leave its
    # first characters behind.
    before = " ".join(f"u{i}{'a' * 40}@mailhost.test" for i in range(40))
    for offset in range(1600):
        text = before[:offset] + " " + local + "@mailhost.test" + " and more words after it" * 30
        out = redact(text)
        assert "mailhost" not in out, offset
        assert local[:4] not in out, (offset, out[-60:])
        assert len(out) <= MAX_OUT


CONTROLS = "".join(chr(c) for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)])


def test_control_characters_never_come_back() -> None:
    text = "\x1b[2J\x1b]0;owned\x07550\tmailbox\r\nfull\x00\x9b31m" + CONTROLS + "end"
    out = redact(text)
    assert not [c for c in out if unicodedata.category(c) == "Cc"], repr(out)
    # Line breaks and tabs keep words apart; the rest just goes.
    assert "550 mailbox" in out and "full" in out and out.endswith("end")


def test_an_event_diagnostic_is_stored_without_control_characters() -> None:
    body = {
        "eventType": "Bounce",
        "mail": {"messageId": "0100abc-1", "tags": {}},
        "bounce": {
            "bounceType": "Permanent",
            "bounceSubType": "General",
            "bouncedRecipients": [
                {
                    "emailAddress": "ada@example.org",
                    "status": "5.1.1",
                    "diagnosticCode": "smtp; 550 \x1b[31m<ada@example.org>\x1b[0m unknown\x9b2J\x07",
                }
            ],
            "feedbackId": "f1",
        },
    }
    event = parse_event(json.dumps(body))
    assert event.diagnostic is not None
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", event.diagnostic), repr(event.diagnostic)
    assert "ada" not in event.diagnostic and "unknown" in event.diagnostic


def test_an_ses_error_text_is_kept_without_control_characters() -> None:
    response: Any = {
        "Error": {"Code": "MessageRejected", "Message": "Rejected \x1b]8;;http://x\x07here\x1b]8;;\x07"},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    result = classify(ClientError(response, "SendEmail"))
    assert result.error is not None and "Rejected" in result.error
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", result.error), repr(result.error)
