"""What SES will accept, refused or put in SES's form at enqueue (issue #27, defects 9, 15, 16).

SES v2 takes 7-bit ASCII local parts and domains in their IDNA (Punycode) form,
and acts on ``X-SES-*`` headers itself. A mail SES would refuse must raise
:class:`InvalidMail` before anything is written; a mail it accepts must reach
it in the form it wants. What reaches SES is read the way the daemon builds it:
the SQS body made from the stored payload, turned into SendEmail parameters.
"""

from __future__ import annotations

import dataclasses
import json
from email import message_from_bytes, policy
from typing import Any

import pytest
import redis

from fairpost import AsyncMailClient, Attachment, InvalidMail, Mail, MailClient
from fairpost.config import TenantSettings
from fairpost.dispatcher.replies import text
from fairpost.mailer.daemon.ses import send_email_request
from fairpost.mailer.sdk.envelope import decode, encode
from tests.support import KEYS, stored_payload

TENANT = "acme"
GOOD: dict[str, Any] = {
    "sender": "Acme <no-reply@acme.example>",
    "to": ["ok@example.com"],
    "subject": "Welcome",
    "text": "Hello!",
}
PDF = Attachment("report.pdf", "application/pdf", b"%PDF-1.4\n")

FULLWIDTH = "\uff41\uff44\uff41@example.com"
"""``ada`` in fullwidth letters: NFC, which email-validator applies, leaves them as they are."""
NON_ASCII_LOCAL_PARTS = [
    "José@example.com",
    FULLWIDTH,
    "Ada <José@example.com>",
    "ada\u200b@example.com",  # a zero-width space hides in the local part
]

# field → (how to place one address there, the field name the error must carry)
FIELDS: dict[str, tuple[str, str]] = {
    "sender": ("sender", "sender"),
    "to": ("to", "to[1]"),
    "cc": ("cc", "cc[1]"),
    "bcc": ("bcc", "bcc[1]"),
    "reply_to": ("reply_to", "reply_to[1]"),
}


def _placed(field: str, address: str) -> dict[str, Any]:
    return {field: address if field == "sender" else ["ok@example.com", address]}


def rejected(client: MailClient, redis_client: redis.Redis, **changes: Any) -> InvalidMail:
    with pytest.raises(InvalidMail) as info:
        client.send(TENANT, **{**GOOD, **changes})
    assert redis_client.dbsize() == 0, "a refused mail wrote to Redis"
    return info.value


def ses_request(redis_url: str, job_id: str) -> dict[str, Any]:
    """The SendEmail parameters the daemon would build for this job, its MIME content loaded."""
    with redis.Redis.from_url(redis_url) as redis_client:
        payload = stored_payload(redis_client, job_id)
        assert payload is not None
        created_ms = int(text(redis_client.hget(KEYS.job(job_id), "created_ms")))
        env = decode(encode(job_id, TENANT, created_ms, payload))
        raw = redis_client.get(env.content_key) if env.content_key else None
    if env.content_key:
        assert isinstance(raw, bytes)
        env = dataclasses.replace(env, mail=dataclasses.replace(env.mail, raw=raw))
    return send_email_request(env, TenantSettings())


# -- defect 9: a local part SES cannot take ------------------------------------------------------


@pytest.mark.parametrize("address", NON_ASCII_LOCAL_PARTS)
@pytest.mark.parametrize("field", FIELDS)
def test_a_non_ascii_local_part_is_refused_in_every_address_field(
    client: MailClient, redis_client: redis.Redis, field: str, address: str
) -> None:
    name, expected_field = FIELDS[field]
    error = rejected(client, redis_client, **_placed(name, address))
    assert error.field == expected_field
    assert "ASCII" in error.rule and "before the @" in error.rule
    # No recipient address in an error: neither the one refused nor its local part.
    bare = address.rpartition("<")[2].rstrip(">")
    assert bare not in str(error) and bare.partition("@")[0] not in str(error)


async def test_a_non_ascii_local_part_is_refused_in_send_many_and_async(
    client: MailClient, aclient: AsyncMailClient, redis_client: redis.Redis
) -> None:
    with pytest.raises(InvalidMail) as info:
        client.send_many(TENANT, [GOOD, {**GOOD, "cc": ["José@example.com"]}])
    assert info.value.field == "mails[1].cc[0]"
    with pytest.raises(InvalidMail) as info:
        await aclient.send(TENANT, **{**GOOD, "to": [FULLWIDTH]})
    assert info.value.field == "to[0]"
    assert redis_client.dbsize() == 0


# -- defects 9 and 15: a domain reaches SES in its Punycode form ---------------------------------


def test_an_internationalised_domain_is_stored_and_sent_as_punycode(
    client: MailClient, redis_client: redis.Redis, redis_url: str
) -> None:
    job_id = client.send(
        TENANT,
        **{
            **GOOD,
            "sender": "Bücher <shop@bücher.example>",
            "to": ["ada@bücher.example", "bob@BÜCHER.example"],
            "reply_to": ["help@bücher.example"],
        },
    )
    payload = json.loads(stored_payload(redis_client, job_id) or "")
    assert payload["to"] == ["ada@xn--bcher-kva.example", "bob@xn--bcher-kva.example"]
    assert payload["reply_to"] == ["help@xn--bcher-kva.example"]
    request = ses_request(redis_url, job_id)
    assert request["Destination"]["ToAddresses"] == payload["to"]
    assert request["ReplyToAddresses"] == ["help@xn--bcher-kva.example"]
    assert request["FromEmailAddress"].endswith("<shop@xn--bcher-kva.example>")
    assert request["FromEmailAddress"].isascii()


def test_a_punycode_domain_reaches_ses_as_written(
    client: MailClient, redis_client: redis.Redis, redis_url: str
) -> None:
    job_id = client.send(
        TENANT, **{**GOOD, "to": ["ada@xn--bcher-kva.example"], "bcc": ["Bob <bob@xn--bcher-kva.example>"]}
    )
    payload = json.loads(stored_payload(redis_client, job_id) or "")
    assert payload["to"] == ["ada@xn--bcher-kva.example"]
    assert payload["bcc"] == ["Bob <bob@xn--bcher-kva.example>"]
    request = ses_request(redis_url, job_id)
    assert request["Destination"] == {
        "ToAddresses": ["ada@xn--bcher-kva.example"],
        "BccAddresses": ["Bob <bob@xn--bcher-kva.example>"],
    }


def test_a_punycode_domain_reaches_ses_as_written_in_a_mime_message(
    client: MailClient, redis_client: redis.Redis, redis_url: str
) -> None:
    job_id = client.send(
        TENANT,
        **{**GOOD, "to": ["ada@xn--bcher-kva.example"], "cc": ["cc@bücher.example"], "attachments": [PDF]},
    )
    request = ses_request(redis_url, job_id)
    assert request["Destination"]["ToAddresses"] == ["ada@xn--bcher-kva.example"]
    assert request["Destination"]["CcAddresses"] == ["cc@xn--bcher-kva.example"]
    message = message_from_bytes(request["Content"]["Raw"]["Data"], policy=policy.default)
    assert message["To"] == "ada@xn--bcher-kva.example"
    assert message["Cc"] == "cc@xn--bcher-kva.example"


# -- defect 16: headers SES acts on --------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["X-SES-CONFIGURATION-SET", "X-SES-MESSAGE-TAGS", "x-ses-source-arn", "X-Ses-From-Arn"]
)
@pytest.mark.parametrize("raw", [False, True], ids=["simple", "raw"])
def test_a_header_ses_acts_on_is_refused(
    client: MailClient, redis_client: redis.Redis, name: str, raw: bool
) -> None:
    changes: dict[str, Any] = {"headers": {"X-Campaign": "spring", name: "other-set"}}
    if raw:
        changes["attachments"] = [PDF]
    error = rejected(client, redis_client, **changes)
    assert error.field == f"headers[{name!r}]"
    assert "X-SES-" in error.rule


def test_a_header_ses_acts_on_is_refused_in_send_many(client: MailClient, redis_client: redis.Redis) -> None:
    with pytest.raises(InvalidMail) as info:
        client.send_many(
            TENANT, [GOOD, Mail(**GOOD, headers={"X-SES-MESSAGE-TAGS": "fairpost-tenant=other"})]
        )
    assert info.value.field == "mails[1].headers['X-SES-MESSAGE-TAGS']"
    assert redis_client.dbsize() == 0


def test_headers_that_only_look_like_ses_ones_still_pass(
    client: MailClient, redis_client: redis.Redis, redis_url: str
) -> None:
    job_id = client.send(TENANT, **{**GOOD, "headers": {"X-Session": "1", "X-SESAME": "2", "X-Ses": "3"}})
    request = ses_request(redis_url, job_id)
    assert request["Content"]["Simple"]["Headers"] == [
        {"Name": "X-Session", "Value": "1"},
        {"Name": "X-SESAME", "Value": "2"},
        {"Name": "X-Ses", "Value": "3"},
    ]


# -- no recipient address in any refusal ---------------------------------------------------------


@pytest.mark.parametrize(
    "address", ["ada@example.com, bob@example.com", "ada.@example..com", "ada@-x.example"]
)
def test_a_refused_address_is_not_repeated_in_the_error(
    client: MailClient, redis_client: redis.Redis, address: str
) -> None:
    error = rejected(client, redis_client, to=[address])
    assert error.field == "to[0]"
    for part in address.replace(",", " ").split():
        assert part not in str(error), f"{part!r} is in the error: {error}"


# -- a suppression names the address as the mail carries it -------------------------------------


def test_a_suppressed_internationalised_domain_matches_the_punycode_the_mail_carries(
    redis_url: str,
) -> None:
    # Mail keeps its domain in Punycode (as SES takes it): a suppression written with
    # the Unicode form must name the same address, or it would never match.
    from fairpost.config import load_settings
    from fairpost.mailer.sdk.suppression import Suppressions, normalize

    assert normalize("Ada <Ada@BÜCHER.example>") == "ada@xn--bcher-kva.example"
    assert normalize("ada@xn--bcher-kva.example") == "ada@xn--bcher-kva.example"
    with Suppressions(load_settings(redis_url=redis_url)) as lists:
        lists.add(TENANT, "ada@bücher.example")
        assert [e.address for e in lists.list(TENANT)] == ["ada@xn--bcher-kva.example"]


def test_a_tenants_default_sender_ses_would_refuse_is_refused_by_the_settings() -> None:
    # Else check-config accepts it and then every mail that takes it is refused.
    from fairpost.config import ConfigError, load_settings

    with pytest.raises(ConfigError) as info:
        load_settings(tenants={"acme": {"default_sender": "José <josé@acme.example>"}})
    assert "DEFAULT_SENDER" in str(info.value) and "ASCII" in str(info.value)
    assert "josé" not in str(info.value).lower()
