"""Whether a tenant's SES identities exist in another pool's SES (#43): a tenant may fall
back to a pool only if they do, or its mail would be refused there.

Asked when an operator names the fallback (``fairpost tenant fallback``), which then writes
it verified; a fallback written unchecked is asked about by the daemon serving the
fallback pool (mailer/daemon/fallback_checks.py) before any mail follows it."""

from __future__ import annotations

from fairpost.config import Settings
from fairpost.mailer.errors import SesUnanswered
from fairpost.mailer.ops.pool_aws import pool_client
from fairpost.mailer.ops.ses_tenants import tenant_identities

__all__ = ["missing_identities"]

_NOT_FOUND = {"NotFoundException", "NotFound"}


def missing_identities(settings: Settings, pool: str, tenant: str) -> list[str]:
    """The tenant's identities that the pool's SES does not have (``GetEmailIdentity``);
    a tenant that names none (no ``ses_identities``, no ``default_sender``) cannot be
    checked, and is refused as such."""
    identities = tenant_identities(settings, tenant)
    if not identities:
        return ["(none named: set the tenant's ses_identities or default_sender)"]
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    missing = []
    # A command waits for an answer a short while, not botocore's default minutes.
    quick = Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2, "mode": "standard"})
    with pool_client(settings, pool, "sesv2", config=quick) as ses:
        for identity in identities:
            try:
                ses.get_email_identity(EmailIdentity=identity)
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code not in _NOT_FOUND:
                    raise SesUnanswered(
                        f"pool {pool}'s SES refused GetEmailIdentity for {identity} ({code})"
                    ) from exc
                missing.append(identity)
            except BotoCoreError as exc:
                raise SesUnanswered(f"pool {pool}'s SES did not answer ({type(exc).__name__})") from exc
    return missing
