"""SES's "not verified": the tenant's sender, or only a recipient?

In SES's sandbox every recipient must be verified too, and SES refuses a mail to
one that is not with the same ``MessageRejected: Email address is not verified.
The following identities failed the check in region US-EAST-1: <identities>`` it
gives an unverified sender. The identities it names decide: the sender's address
or domain among them is the tenant's own set-up (the tenant is held, nothing
dead); recipients only is that mail's fault (dead, with SES's reason, no address
in it); anything else stays the tenant's, as before.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.daemon.ses import Verdict, classify
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings

SENDER = "Acme <app@mail.acme.example>"


def unverified(identities: str | None) -> ClientError:
    message = "Email address is not verified."
    if identities is not None:
        message += f" The following identities failed the check in region US-EAST-1: {identities}"
    return ClientError(
        {
            "Error": {"Code": "MessageRejected", "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        "SendEmail",
    )


def request(
    *, to: tuple[str, ...] = ("ada@example.org",), cc: tuple[str, ...] = (), bcc: tuple[str, ...] = ()
) -> dict[str, Any]:
    destination: dict[str, Any] = {"ToAddresses": list(to)}
    if cc:
        destination["CcAddresses"] = list(cc)
    if bcc:
        destination["BccAddresses"] = list(bcc)
    return {"FromEmailAddress": SENDER, "Destination": destination, "Content": {"Raw": {"Data": b"x"}}}


@pytest.mark.parametrize(
    ("identities", "mail"),
    [
        ("ada@example.org", request()),
        ("ADA@Example.ORG", request()),
        ("ada@example.org, bob@example.net", request(cc=("Bob <bob@example.net>",))),
        ("carol@example.com", request(to=("Ada <ada@example.org>",), bcc=("carol@example.com",))),
        ("example.org", request()),
    ],
    ids=["one-recipient", "case", "to-and-cc", "bcc-only", "a-recipients-domain"],
)
def test_only_recipients_named_is_a_dead_mail_with_ses_reason(identities: str, mail: dict[str, Any]) -> None:
    result = classify(unverified(identities), mail)
    assert result.verdict is Verdict.PERMANENT
    assert result.error is not None and "not verified" in result.error
    # No address in it: SES's reason, with its recipients masked.
    assert "@" not in result.error
    for part in ("ada", "bob", "carol"):
        assert part not in result.error.lower(), result.error


@pytest.mark.parametrize(
    ("identities", "mail"),
    [
        ("app@mail.acme.example", request()),
        ("mail.acme.example", request()),
        ("acme.example", request()),
        ("ada@example.org, app@mail.acme.example", request()),
        ("app@bad.example", request()),  # names neither: as before, the tenant's
        (None, request()),  # names nothing
        ("ada@example.org", None),  # no request to compare with
        ("app@mail.acme.example", request(to=("app@mail.acme.example",))),  # a mail to itself
    ],
    ids=[
        "sender",
        "senders-domain",
        "senders-parent-domain",
        "sender-and-recipient",
        "someone-else",
        "no-list",
        "no-request",
        "sender-is-recipient",
    ],
)
def test_the_senders_identity_named_holds_the_tenant(
    identities: str | None, mail: dict[str, Any] | None
) -> None:
    result = classify(unverified(identities), mail)
    assert result.verdict is Verdict.TENANT
    assert result.reason == "ses_MessageRejected"


def test_a_similar_domain_is_not_the_senders() -> None:
    # "notacme.example" is not acme.example, nor a parent of mail.acme.example.
    mail = request(to=("ada@notacme.example",))
    assert classify(unverified("ada@notacme.example"), mail).verdict is Verdict.PERMANENT
    assert classify(unverified("notacme.example"), mail).verdict is Verdict.PERMANENT


STRANGER = "stranger@example.net"


def mail_to(address: str, i: int) -> Mail:
    return Mail(sender="app@example.com", to=[address], subject=f"m{i}", text="hi")


async def test_a_mail_to_an_unverified_recipient_dies_and_its_tenant_sends_on(
    redis_url: str, ses_env: SesServer, caplog: pytest.LogCaptureFixture
) -> None:
    ses = ses_env
    ses.fail_when(
        lambda m: STRANGER in m.recipients,
        Faults.IDENTITY_NOT_VERIFIED.with_message(
            f"Email address is not verified. The following identities failed the check in region "
            f"US-EAST-1: {STRANGER}"
        ),
    )
    settings = quick_settings(redis_url)
    caplog.set_level(logging.INFO, logger="fairpost")
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        dead, *good = await client.send_many(
            "acme",
            [mail_to(a, i) for i, a in enumerate([STRANGER, *(f"user{i}@example.org" for i in range(3))])],
        )

        async def settled() -> bool:
            states = [(await client.status(j)).state for j in [dead, *good]]
            return states == [JobState.DEAD, *[JobState.SENT] * len(good)]

        await wait_for_async(settled, within=30, what="the stranger's mail dead, the others sent")
        status = await client.status(dead)
        stats = run.sender.stats
    assert status.dead_reason is not None and "not verified" in status.dead_reason
    assert "stranger" not in status.dead_reason
    assert status.attempts == 0
    # The tenant was never held for it.
    assert "tenant" not in stats.by_reason
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(good)
    assert not [r.getMessage() for r in caplog.records if "stranger" in r.getMessage()]
