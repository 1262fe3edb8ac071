"""Whether a tenant's SES identities exist in another pool's SES (#43): a tenant may fall
back to a pool only if they do, or its mail would be refused there."""

from __future__ import annotations

from fairpost.config import Settings
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
    missing = []
    with pool_client(settings, pool, "sesv2") as ses:
        for identity in identities:
            try:
                ses.get_email_identity(EmailIdentity=identity)
            except Exception as exc:
                code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
                if code not in _NOT_FOUND:
                    raise
                missing.append(identity)
    return missing
