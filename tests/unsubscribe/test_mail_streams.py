"""Streams, topics and the List-Unsubscribe headers as the SDK builds them (issue #42)."""

from __future__ import annotations

import base64
import email
import email.policy
import time

import pytest

from fairpost.config import ConfigError, Settings, load_settings
from fairpost.mailer.errors import InvalidMail, InvalidToken
from fairpost.mailer.sdk.attachments import Attachment
from fairpost.mailer.sdk.compose import mail_job
from fairpost.mailer.sdk.headers import ONE_CLICK, UNSUBSCRIBE_RULE
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import Mail, ValidMail
from fairpost.mailer.sdk.streams import group_id, payload_stream
from fairpost.mailer.sdk.unsub_token import Token, sign, verify

KEY = "k" * 40
OLD_KEY = "o" * 40
BASE = "https://mail.example.com"


def unsub_settings(**extra: object) -> Settings:
    section = {"keys": [KEY, OLD_KEY], "base_url": BASE, "mailto_domain": "unsub.example.com", **extra}
    return load_settings(unsubscribe=section)


def job_of(settings: Settings, mail: Mail) -> tuple[ValidMail, str, str]:
    job = mail_job(settings, MailKeys("t"), "acme", mail, priority="normal", kind="mail")
    return ValidMail.from_json(job.payload), job.payload, job.priority


def mail(**fields: object) -> Mail:
    base: dict[str, object] = {"sender": "a@acme.example", "to": "Ada <ada@example.com>", "subject": "Hi"}
    base["text"] = "hello"
    base.update(fields)
    return Mail(**base)  # type: ignore[arg-type]


def test_transactional_mail_is_as_before_and_gets_no_header() -> None:
    valid, payload, lane = job_of(unsub_settings(), mail())
    assert '"stream"' not in payload and lane == "normal"
    assert valid.headers == {} and valid.stream == "transactional" and valid.topic is None
    assert payload_stream(payload) == "transactional" and group_id("acme", "transactional") == "acme"


def test_notification_mail_gets_both_headers_and_its_token_verifies() -> None:
    valid, payload, lane = job_of(unsub_settings(), mail(stream="notification", topic="comments"))
    assert lane == "bulk.normal" and payload_stream(payload) == "notification"
    assert group_id("acme", "notification") == "acme:notification"
    assert valid.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    https, mailto = valid.headers["List-Unsubscribe"].split(", ")
    assert https.startswith(f"<{BASE}/u/") and mailto.startswith("<mailto:u-")
    token = verify(https[len(BASE) + 4 : -1], [KEY.encode()], time.time())
    assert (token.tenant, token.address, token.topic) == ("acme", "ada@example.com", "comments")
    assert mailto.split("u-", 1)[1].split("@")[0] == https[len(BASE) + 4 : -1]


def test_a_notification_without_a_topic_is_general() -> None:
    valid, _, _ = job_of(unsub_settings(), mail(stream="notification"))
    assert valid.topic == "general"


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"stream": "bulk"}, "stream", "transactional, notification"),
        ({"topic": "x"}, "topic", "only notification mail"),
        ({"stream": "notification", "topic": "Bad Topic"}, "topic", "a-z"),
        ({"stream": "notification", "to": ["a@example.com", "b@example.com"]}, "to", "exactly one"),
        ({"stream": "notification", "cc": "c@example.com"}, "to", "exactly one"),
    ],
)
def test_bad_streams_and_topics_are_refused_by_name(
    fields: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(InvalidMail) as caught:
        job_of(unsub_settings(), mail(**fields))
    assert caught.value.field == field and words in caught.value.rule


def test_notification_mail_without_unsubscribe_settings_is_refused() -> None:
    with pytest.raises(InvalidMail) as caught:
        job_of(load_settings(), mail(stream="notification"))
    assert caught.value.field == "stream" and "FAIRPOST_UNSUBSCRIBE__KEYS" in caught.value.rule


@pytest.mark.parametrize(
    "headers",
    [
        {"List-Unsubscribe": "<mailto:u@acme.example>"},
        {"List-Unsubscribe": "<http://acme.example/u>", "List-Unsubscribe-Post": ONE_CLICK},
        {"List-Unsubscribe": "<https://acme.example/u>"},
        {"list-unsubscribe": "<https://acme.example/u>", "List-Unsubscribe-Post": "yes"},
        {"List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
    ],
)
def test_an_applications_own_header_must_meet_the_one_click_rule(headers: dict[str, str]) -> None:
    with pytest.raises(InvalidMail) as caught:
        job_of(unsub_settings(), mail(stream="notification", headers=headers))
    assert caught.value.rule == UNSUBSCRIBE_RULE and "headers[" in caught.value.field


def test_an_applications_own_https_header_is_kept_as_given() -> None:
    own = {"List-Unsubscribe": "<https://acme.example/u/1>", "List-Unsubscribe-Post": ONE_CLICK}
    valid, _, _ = job_of(load_settings(), mail(stream="notification", headers=own))
    assert valid.headers == own
    # Transactional mail may carry whatever the application gives: the rule is the notification's.
    valid, _, _ = job_of(load_settings(), mail(headers={"List-Unsubscribe": "<mailto:u@acme.example>"}))
    assert valid.headers == {"List-Unsubscribe": "<mailto:u@acme.example>"}


def test_the_mime_path_folds_the_long_header_and_never_encodes_it() -> None:
    settings = unsub_settings()
    job = mail_job(
        settings, MailKeys("t"), "acme",
        mail(stream="notification", topic="comments", to="a" * 60 + "@example.com",
             attachments=[Attachment("a.txt", "text/plain", b"hi")]),
        priority="normal", kind="mail",
    )  # fmt: skip
    assert job.content is not None
    assert b"=?" not in job.content.split(b"\r\n\r\n", 1)[0]
    parsed = email.message_from_bytes(job.content, policy=email.policy.default)
    value = " ".join(str(parsed["List-Unsubscribe"]).split())
    https = value.split(",")[0].strip()
    assert https.startswith(f"<{BASE}/u/")
    token = verify(https[len(BASE) + 4 : -1], [KEY.encode()], time.time())
    assert token.address == "a" * 60 + "@example.com"
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert all(len(line) <= 998 for line in job.content.split(b"\r\n"))


def test_tokens_rotate_and_refuse_forgery_and_expiry() -> None:
    now = time.time()
    token = Token("acme", "ada@example.com", "comments", int(now) + 60)
    old = sign(token, OLD_KEY.encode())
    assert verify(old, [KEY.encode(), OLD_KEY.encode()], now) == token
    with pytest.raises(InvalidToken, match="forged"):
        verify(old, [KEY.encode()], now)
    new = sign(token, KEY.encode())
    assert len(new) < 120
    # Signed with a key this deployment does not hold.
    other = sign(Token("acme", "ada@example.com", "comments", int(now) + 60), b"x" * 40)
    with pytest.raises(InvalidToken, match="forged"):
        verify(other, [KEY.encode()], now)
    flipped = new[:10] + ("a" if new[10] != "a" else "b") + new[11:]
    with pytest.raises(InvalidToken, match=r"forged|malformed"):
        verify(flipped, [KEY.encode()], now)
    with pytest.raises(InvalidToken, match="expired"):
        verify(new, [KEY.encode()], now + 61)
    with pytest.raises(InvalidToken, match="malformed"):
        verify("not-a-token!", [KEY.encode()], now)


@pytest.mark.parametrize(
    ("section", "variable", "words"),
    [
        ({"keys": ["short"]}, "FAIRPOST_UNSUBSCRIBE__KEYS", "at least 32 characters"),
        ({"base_url": "http://mail.example.com"}, "FAIRPOST_UNSUBSCRIBE__BASE_URL", "https:// URL"),
        ({"base_url": "https://a.example/u>x"}, "FAIRPOST_UNSUBSCRIBE__BASE_URL", "https:// URL"),
        ({"mailto_domain": "not a domain"}, "FAIRPOST_UNSUBSCRIBE__MAILTO_DOMAIN", "a domain name"),
    ],
)
def test_bad_unsubscribe_settings_are_refused_naming_the_rule(
    section: dict[str, object], variable: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(unsubscribe=section)
    assert variable in str(caught.value) and words in str(caught.value)
    assert "short" not in str(caught.value)  # a key is never echoed


def test_a_notification_names_its_stream_and_may_have_its_own_configuration_set() -> None:
    from fairpost.mailer.daemon.ses import send_email_request
    from fairpost.mailer.sdk.envelope import Envelope

    sets = {"configuration_set": "acme", "notification_configuration_set": "acme-bulk"}
    settings = load_settings(unsubscribe=unsub_settings().unsubscribe.model_dump(), tenants={"acme": sets})
    note, _, _ = job_of(settings, mail(stream="notification", topic="digest"))
    plain, _, _ = job_of(settings, mail())
    own = settings.tenant("acme")
    bulk = send_email_request(Envelope("j1", "acme", 1, note), own)
    assert bulk["ConfigurationSetName"] == "acme-bulk"
    assert {"Name": "fairpost-stream", "Value": "notification"} in bulk["EmailTags"]
    transactional = send_email_request(Envelope("j2", "acme", 1, plain), own)
    assert transactional["ConfigurationSetName"] == "acme"
    assert all(t["Name"] != "fairpost-stream" for t in transactional["EmailTags"])
    # Without a set of its own, a notification goes out under the tenant's.
    bare = send_email_request(Envelope("j3", "acme", 1, note), unsub_settings().tenant("acme"))
    assert "ConfigurationSetName" not in bare


def test_a_token_made_over_to_another_tenant_is_forged() -> None:
    now = time.time()
    token = sign(Token("acme", "ada@example.com", "digest", int(now) + 60), KEY.encode())
    raw = base64.b32decode(token.upper() + "=" * (-len(token) % 8))
    # The same tag over a body that names another tenant (same length, so only the name moves).
    other = raw.replace(b"acme\x1f", b"evil\x1f")
    assert other != raw
    forged = base64.b32encode(other).decode().rstrip("=").lower()
    with pytest.raises(InvalidToken, match="forged"):
        verify(forged, [KEY.encode(), OLD_KEY.encode()], now)


def test_a_header_too_long_for_ses_keeps_the_https_link_alone() -> None:
    # SES v2 takes a header value of at most 870 characters (mailer/sdk/headers.py); a
    # long address makes a long token, written twice with the mailto: address.
    from fairpost.mailer.sdk.headers import MAX_VALUE_CHARS, check_header

    long_address = "a" * 64 + "@" + "b" * 63 + "." + "c" * 63 + ".example.com"
    valid, _, _ = job_of(unsub_settings(), mail(to=long_address, stream="notification", topic="t" * 32))
    value = valid.headers["List-Unsubscribe"]
    # The two URIs would not fit.
    token = value.split("/u/")[1].rstrip(">")
    assert len(f"{value}, <mailto:u-{token}@unsub.example.com?subject=unsubscribe>") > MAX_VALUE_CHARS
    assert len(value) <= MAX_VALUE_CHARS and check_header("List-Unsubscribe", value) == value
    assert value.startswith(f"<{BASE}/u/") and "mailto:" not in value
    # A link that could never fit is refused at send, naming the setting, not queued to die at SES.
    with pytest.raises(InvalidMail) as caught:
        job_of(unsub_settings(base_url=BASE + "/" + "p" * 500), mail(to=long_address, stream="notification"))
    assert "FAIRPOST_UNSUBSCRIBE__BASE_URL" in caught.value.rule
