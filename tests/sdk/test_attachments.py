"""Attachments, raw MIME and claim checks: the SDK builds the MIME message with
the standard library's ``email``, keeps it in Redis beside the job, the SQS
message carries its key (envelope version 2), and SES v2 gets ``Content.Raw``.
"""

from __future__ import annotations

import json
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import redis

from fairpost import AsyncMailClient, Attachment, InvalidMail, Mail, MailClient
from fairpost.config import ConfigError, Settings, TenantSettings, load_settings
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.cli import main
from fairpost.mailer.daemon.ses import send_email_request
from fairpost.mailer.errors import NewerFormat, PoisonMessage
from fairpost.mailer.sdk.envelope import Envelope, decode, encode
from fairpost.mailer.sdk.mail import validate
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import KEYS, stored_payload
from tests.support.pipeline import pipeline

GOOD: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}
PDF = Attachment("report.pdf", "application/pdf", b"%PDF-1.4\n" + bytes(range(256)) * 40)


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return load_settings(redis_url=redis_url, max_message_bytes=5_000_000)


def parse(raw: bytes) -> EmailMessage:
    message = message_from_bytes(raw, policy=policy.default)
    assert isinstance(message, EmailMessage)
    return message


def content_of(redis_url: str, job_id: str) -> bytes | None:
    with redis.Redis.from_url(redis_url) as raw:
        value = raw.get(KEYS.content(job_id))
    assert value is None or isinstance(value, bytes)
    return value


# -- building the MIME message -------------------------------------------------------


def test_a_mail_with_attachments_is_kept_as_mime_beside_its_job(
    client: MailClient, redis_client: redis.Redis, redis_url: str
) -> None:
    job_id = client.send(
        "acme",
        sender="Acme Café <app@example.com>",
        to=["Ada <ada@example.org>"],
        cc=["cc@example.org"],
        bcc=["hidden@example.org"],
        reply_to=["help@example.com"],
        subject="Your report — März",
        text="See the attachment.",
        html="<p>See the <b>attachment</b>.</p>",
        headers={"X-Campaign": "spring"},
        attachments=[PDF, Attachment("notes.txt", "text/plain", "ünïcode\n".encode())],
    )
    payload = json.loads(stored_payload(redis_client, job_id) or "")
    raw = content_of(redis_url, job_id)
    assert raw is not None
    # The payload (and so the SQS message) carries addresses and the key, not the content.
    assert payload["content"] == "stored" and payload["content_key"] == KEYS.content(job_id)
    assert payload["size"] == len(raw)
    assert payload["bcc"] == ["hidden@example.org"] and payload["text"] is None
    assert client.status(job_id).recipients == 3

    message = parse(raw)
    assert b"\r\n" in raw and b"\n" not in raw.replace(b"\r\n", b"")
    assert message["From"] == "Acme Café <app@example.com>"
    assert message["To"] == "Ada <ada@example.org>"
    assert message["Cc"] == "cc@example.org"
    assert message["Reply-To"] == "help@example.com"
    assert message["Bcc"] is None, "Bcc recipients must not be visible in the message"
    assert message["Subject"] == "Your report — März"
    assert message["X-Campaign"] == "spring"
    assert message.get_content_type() == "multipart/mixed"
    body = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    assert body is not None and body.get_content().strip() == "See the attachment."
    assert html is not None and "<b>attachment</b>" in html.get_content()
    files = {part.get_filename(): part for part in message.iter_attachments()}
    assert set(files) == {"report.pdf", "notes.txt"}
    assert files["report.pdf"].get_content_type() == "application/pdf"
    assert files["report.pdf"].get_content() == PDF.data
    assert files["notes.txt"].get_payload(decode=True) == "ünïcode\n".encode()


def test_attachment_from_path_guesses_the_type(tmp_path: Path) -> None:
    path = tmp_path / "invoice.pdf"
    path.write_bytes(b"%PDF")
    assert Attachment.from_path(path) == Attachment("invoice.pdf", "application/pdf", b"%PDF")
    odd = tmp_path / "blob.unknownext"
    odd.write_bytes(b"x")
    assert Attachment.from_path(odd).content_type == "application/octet-stream"


@pytest.mark.parametrize(
    ("attachments", "field"),
    [
        (PDF, "attachments"),
        (["not an attachment"], "attachments[0]"),
        ([Attachment("", "text/plain", b"x")], "attachments[0].filename"),
        ([Attachment("../etc/passwd", "text/plain", b"x")], "attachments[0].filename"),
        ([Attachment("a\r\nBcc: x", "text/plain", b"x")], "attachments[0].filename"),
        ([PDF, Attachment("a.txt", "text", b"x")], "attachments[1].content_type"),
        ([Attachment("a.txt", "text/plain\r\nX: y", b"x")], "attachments[0].content_type"),
        ([Attachment("a.txt", "text/plain", "not bytes")], "attachments[0].data"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_attachment_is_refused(
    client: MailClient, redis_client: redis.Redis, attachments: Any, field: str
) -> None:
    with pytest.raises(InvalidMail) as caught:
        client.send("acme", **GOOD, attachments=attachments)
    assert caught.value.field == field
    assert redis_client.dbsize() == 0


def test_headers_fairpost_sets_cannot_be_overridden_in_mime(
    client: MailClient, redis_client: redis.Redis
) -> None:
    with pytest.raises(InvalidMail) as caught:
        client.send("acme", **GOOD, headers={"Content-Type": "text/evil"}, attachments=[PDF])
    assert caught.value.field == "headers['Content-Type']"
    assert redis_client.dbsize() == 0


# -- sizes ------------------------------------------------------------------------------------


def test_the_size_limit_counts_the_whole_mime_message(redis_url: str, redis_client: redis.Redis) -> None:
    with MailClient(load_settings(redis_url=redis_url, max_message_bytes=1_000_000)) as small:
        big = Attachment("big.bin", "application/octet-stream", b"\0" * 800_000)  # ~1.08 MB in base64
        with pytest.raises(InvalidMail) as caught:
            small.send("acme", **GOOD, attachments=[big])
    assert caught.value.field == "size"
    assert "FAIRPOST_MAX_MESSAGE_BYTES" in caught.value.rule and "1000000" in caught.value.rule
    assert redis_client.dbsize() == 0


def test_ses_v2s_40_mb_cap_is_checked_at_enqueue(redis_url: str, redis_client: redis.Redis) -> None:
    with MailClient(load_settings(redis_url=redis_url, max_message_bytes=40_000_000)) as client:
        huge = Attachment("huge.bin", "application/octet-stream", b"\0" * 30_000_000)  # 40.5 MB encoded
        with pytest.raises(InvalidMail) as caught:
            client.send_many("acme", [Mail(**GOOD), Mail(**GOOD, attachments=[huge])])
    assert caught.value.field == "mails[1].size"
    assert "SES v2 accepts at most 40,000,000" in caught.value.rule
    assert redis_client.dbsize() == 0


def test_max_message_bytes_may_go_up_to_ses_v2s_cap() -> None:
    assert load_settings(max_message_bytes=40_000_000).max_message_bytes == 40_000_000
    with pytest.raises(ConfigError, match="FAIRPOST_MAX_MESSAGE_BYTES"):
        load_settings(max_message_bytes=40_000_001)


def test_a_plain_mail_too_big_for_sqs_becomes_a_claim_check(
    client: MailClient, redis_client: redis.Redis, redis_url: str
) -> None:
    small = client.send("acme", **GOOD)
    assert not json.loads(stored_payload(redis_client, small) or "").get("content")
    assert content_of(redis_url, small) is None
    text = "a long line of text. " * 20_000  # 420 kB: over the 256 KiB inline limit
    job_id = client.send("acme", **{**GOOD, "text": text})
    payload = json.loads(stored_payload(redis_client, job_id) or "")
    assert payload["content"] == "stored"
    raw = content_of(redis_url, job_id)
    assert raw is not None
    body = parse(raw).get_body(preferencelist=("plain",))
    assert body is not None and body.get_content().rstrip("\r\n") == text


# -- envelope versions -----------------------------------------------------------------------------


def test_envelope_v1_is_still_written_and_read_and_v2_carries_the_content_key(
    client: MailClient, redis_client: redis.Redis
) -> None:
    _, plain_payload = validate(Mail(**GOOD), max_bytes=10_000)
    v1 = encode("j1", "acme", 5, plain_payload)
    assert json.loads(v1)["v"] == 1 and "content_key" not in json.loads(v1)
    env = decode(v1)
    assert env.content_key is None and env.mail.text == "t" and env.mail.raw is None
    # As an older fairpost wrote it, by hand.
    old = ('{"v":1,"job_id":"j0","tenant":"acme","created_ms":1,"mail":{"from":"a@example.com",'
           '"to":["b@example.org"],"cc":[],"bcc":[],"reply_to":[],"subject":"s","text":"t",'
           '"html":null,"headers":{}}}')  # fmt: skip
    assert decode(old).mail.to == ("b@example.org",)

    job_id = client.send("acme", **GOOD, attachments=[PDF])
    payload = stored_payload(redis_client, job_id)
    assert isinstance(payload, str)
    body = encode(job_id, "acme", 5, payload)
    data = json.loads(body)
    assert data["v"] == 2 and data["content_key"] == KEYS.content(job_id)
    assert len(body) < 1000, "the content must not travel in the SQS message"
    env2 = decode(body)
    assert env2.content_key == KEYS.content(job_id) and env2.mail.recipients == 1
    assert decode(env2.encode()) == env2
    assert decode(env.encode()) == env

    for bad, why in [
        ({**data, "v": 0}, "unknown envelope version 0 (this fairpost reads 1 and 2)"),
        ({**data, "v": True}, "unknown envelope version True"),
        ({k: v for k, v in data.items() if k != "content_key"}, "missing or malformed"),
        ({**data, "content_key": ""}, "empty content key"),
    ]:
        with pytest.raises(PoisonMessage, match=why.replace("(", r"\(").replace(")", r"\)")):
            decode(json.dumps(bad))
    # A version above both: a newer fairpost wrote it, and it is left for a newer reader (#38).
    with pytest.raises(
        NewerFormat, match="sqs_body in format version 3; this fairpost reads up to version 2"
    ):
        decode(json.dumps({**data, "v": 3}))


def test_ses_gets_raw_content_with_every_recipient_in_destination() -> None:
    valid, _ = validate(
        Mail(**GOOD, bcc=["hidden@example.org"], reply_to=["help@example.com"]), max_bytes=10_000
    )
    env = Envelope("j1", "acme", 1, valid)
    simple = send_email_request(env, TenantSettings())
    assert "Simple" in simple["Content"] and simple["ReplyToAddresses"] == ["help@example.com"]
    env_raw = Envelope("j1", "acme", 1, valid.__class__(**{**valid.__dict__, "raw": b"MIME"}))
    request = send_email_request(env_raw, TenantSettings(configuration_set="cs"))
    assert request["Content"] == {"Raw": {"Data": b"MIME"}}
    assert request["Destination"]["BccAddresses"] == ["hidden@example.org"]
    assert "ReplyToAddresses" not in request  # in the MIME headers
    assert request["ConfigurationSetName"] == "cs"


# -- end to end ---------------------------------------------------------------------------------------


def e2e_settings(redis_url: str) -> Settings:
    return load_settings(
        redis_url=redis_url,
        global_limits="1000/second",
        tenant_limits="1000/second",
        max_message_bytes=5_000_000,
        sender={"wait_seconds": 1, "receivers": 1, "max_jitter_seconds": 0.2},
    )


async def state_is(client: AsyncMailClient, job_id: str, state: str) -> bool:
    return (await client.status(job_id)).state == state


async def all_sent(client: AsyncMailClient, ids: list[str]) -> bool:
    return all([await state_is(client, job_id, JobState.SENT) for job_id in ids])


# aiohttp warns (ResourceWarning) about request bodies over 1 MiB; the tests turn warnings into errors.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
@pytest.mark.usefixtures("ses_env")
async def test_attachments_and_big_mail_reach_ses_as_raw_mime_through_a_claim_check(
    redis_url: str, ses: SesServer
) -> None:
    settings = e2e_settings(redis_url)
    text = "x" * 600_000
    big_pdf = Attachment("big.pdf", "application/pdf", bytes(range(256)) * 8000)  # 2 MB: over SQS's 1 MiB
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        with_files = await client.send("acme", **GOOD, bcc=["hidden@example.org"], attachments=[PDF, big_pdf])
        big_text = await client.send("acme", **{**GOOD, "text": text})
        plain = await client.send("acme", **GOOD)
        ids = [with_files, big_text, plain]
        await wait_for_async(lambda: all_sent(client, ids), within=20, what="every mail")
        bodies = [body for _, body in run.receives.bodies]
    by_job = {m.job_id: m for m in ses.sent}
    assert set(by_job) == {with_files, big_text, plain}
    # What went through SQS: small claim checks (v2) and one plain v1 message.
    versions = {json.loads(b)["job_id"]: json.loads(b)["v"] for b in bodies}
    assert versions == {with_files: 2, big_text: 2, plain: 1}
    assert max(len(b) for b in bodies) < 2000
    sent = by_job[with_files]
    assert sent.raw_data is not None and sent.bcc == ("hidden@example.org",)
    files = {p.get_filename(): p.get_content() for p in parse(sent.raw_data).iter_attachments()}
    assert files == {"report.pdf": PDF.data, "big.pdf": big_pdf.data}
    assert sent.raw_data is not None and b"hidden@example.org" not in sent.raw_data
    raw_text = by_job[big_text].raw_data
    assert raw_text is not None
    body = parse(raw_text).get_body(preferencelist=("plain",))
    assert body is not None and body.get_content().rstrip("\r\n") == text
    assert by_job[plain].raw_data is None  # Content.Simple
    # Sent: the content is gone at once, the record keeps its metadata.
    assert content_of(redis_url, with_files) is None and content_of(redis_url, big_text) is None


@pytest.mark.usefixtures("ses_env")
async def test_a_claim_check_whose_content_is_gone_is_a_dead_letter(redis_url: str, ses: SesServer) -> None:
    settings = e2e_settings(redis_url)
    async with AsyncMailClient(settings) as client:
        job_id = await client.send("acme", **GOOD, attachments=[PDF])
        with redis.Redis.from_url(redis_url) as raw:
            raw.delete(KEYS.content(job_id))
        async with pipeline(settings) as run:
            await wait_for_async(
                lambda: state_is(client, job_id, JobState.DEAD), within=20, what="the dead letter"
            )
            usage = await run.quota.usage("acme", settings.limits_for("acme"))
        status = await client.status(job_id)
    assert status.dead_reason is not None and "content (a claim check) is gone" in status.dead_reason
    assert ses.sent_count == 0
    assert [used for _, used in usage] == [0]  # its quota units were refunded


def test_cli_send_attach(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    path = tmp_path / "report.pdf"
    path.write_bytes(PDF.data)
    base = ["send", "--tenant", "acme", "--from", "app@example.com", "--to", "ada@example.org",
            "--subject", "s", "--text", "t"]  # fmt: skip
    assert main([*base, "--attach", str(path), "--header", "X-Campaign: spring"]) == 0
    job_id = capsys.readouterr().out.strip()
    raw = content_of(redis_url, job_id)
    assert raw is not None
    message = parse(raw)
    assert message["X-Campaign"] == "spring"
    assert [(p.get_filename(), p.get_content_type()) for p in message.iter_attachments()] == [
        ("report.pdf", "application/pdf")
    ]
    assert main([*base, "--attach", str(tmp_path / "missing.pdf")]) == 1
    assert "cannot read attachment" in capsys.readouterr().err
