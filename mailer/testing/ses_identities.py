"""``GetEmailIdentity`` (``GET /v2/email/identities/{identity}``) for
:class:`~fairpost.mailer.testing.ses_server.SesServer`: whether an address or domain is
an identity of the emulated account.

An account that verifies no identity (``SesServer.verify`` never called) sends from
any sender, so it has every identity; once identities are verified, only those exist.
"""

from __future__ import annotations

from urllib.parse import unquote

from fairpost.mailer.testing.http_endpoint import Answer
from fairpost.mailer.testing.ses_http import error_answer, json_answer
from fairpost.mailer.testing.ses_mail import Faults

__all__ = ["IDENTITIES_PATH", "identity_answer"]

IDENTITIES_PATH = "/v2/email/identities/"


def identity_answer(path: str, verified: set[str] | None) -> Answer:
    """The answer to GetEmailIdentity for ``path`` (under :data:`IDENTITIES_PATH`)."""
    identity = unquote(path[len(IDENTITIES_PATH) :]).lower()
    if verified is not None and identity not in verified:
        return error_answer(Faults.NOT_FOUND.with_message(f"Email identity <{identity}> does not exist."))
    kind = "EMAIL_ADDRESS" if "@" in identity else "DOMAIN"
    return json_answer(
        200,
        {"IdentityType": kind, "VerifiedForSendingStatus": True,
         "VerificationStatus": "SUCCESS", "FeedbackForwardingStatus": True},
    )  # fmt: skip
