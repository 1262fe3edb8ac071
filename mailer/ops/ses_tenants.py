"""``fairpost ses-tenants sync``: make SES's tenants match the configuration, idempotently.

For every fairpost tenant that maps to an SES tenant (its ``ses_tenant_name``;
with ``FAIRPOST_SES_TENANT_NAMES=tenant_id`` every tenant, configured or
ever seen in Redis, by the rule of :mod:`fairpost.config.ses_names`):

- ``GetTenant``; ``CreateTenant`` if SES has none of that name;
- ``ListTenantResources``; ``CreateTenantResourceAssociation`` for each of its
  resources SES does not have yet: its sender identities (``ses_identities``,
  else the domain of its ``default_sender``) and its ``configuration_set`` (and its
  ``notification_configuration_set``).
  The ARNs are built from the tenant's own ARN (region and account), so no
  other call is needed.

Resources SES has associated that the configuration does not name are
reported as differing, never removed. ``--dry-run`` reads only. A second
run changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from fairpost.config import Settings
from fairpost.mailer.errors import SesTenantError

__all__ = ["TenantSync", "ses_tenant_map", "set_customer_status", "sync_tenants", "tenant_identities"]


@dataclass
class TenantSync:
    tenant: str
    ses_tenant: str
    created: bool = False
    associated: list[str] = field(default_factory=list)
    """Resource ARNs associated by this run (or that would be, with --dry-run)."""
    extra: list[str] = field(default_factory=list)
    """Resource ARNs SES has associated that the configuration does not name."""
    status: str | None = None
    """The tenant's sending status as GetTenant reports it."""

    @property
    def changed(self) -> bool:
        return self.created or bool(self.associated)

    def to_json(self) -> dict[str, Any]:
        return {
            "ses_tenant": self.ses_tenant,
            "created": self.created,
            "associated": self.associated,
            "differs": self.extra,
            "status": self.status,
        }


def ses_tenant_map(settings: Settings, seen: set[str] | None = None) -> dict[str, str]:
    """fairpost tenant → SES tenant name, for every tenant that has one."""
    tenants = set(settings.tenants) | (seen if settings.ses_tenant_names == "tenant_id" and seen else set())
    mapping = {}
    for tenant in sorted(tenants):
        name = settings.ses_tenant_for(tenant)
        if name:
            mapping[tenant] = name
    return mapping


def tenant_identities(settings: Settings, tenant: str) -> list[str]:
    """The SES identities the tenant sends from: its ``ses_identities``, else its
    ``default_sender``'s domain; empty when it names neither."""
    own = settings.tenant(tenant)
    identities = list(own.ses_identities)
    if not identities and own.default_sender:
        from email.utils import parseaddr

        identities = [parseaddr(own.default_sender)[1].rpartition("@")[2]]
    return [identity for identity in identities if identity]


def _resources(settings: Settings, tenant: str, tenant_arn: str) -> list[str]:
    # arn:aws:ses:REGION:ACCOUNT:tenant/NAME/ID → arn:aws:ses:REGION:ACCOUNT:
    base = tenant_arn.split("tenant/", 1)[0]
    own = settings.tenant(tenant)
    arns = [f"{base}identity/{identity}" for identity in tenant_identities(settings, tenant)]
    for configuration_set in dict.fromkeys((own.configuration_set, own.notification_configuration_set)):
        if configuration_set:
            arns.append(f"{base}configuration-set/{configuration_set}")
    return arns


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def sync_tenants(
    ses: Any, settings: Settings, *, seen: set[str] | None = None, dry_run: bool = False
) -> list[TenantSync]:
    """Create missing SES tenants and associate their resources (``ses``: a blocking sesv2 client)."""
    report = []
    for tenant, name in ses_tenant_map(settings, seen).items():
        entry = TenantSync(tenant, name)
        try:
            try:
                found = ses.get_tenant(TenantName=name)["Tenant"]
            except ClientError as exc:
                if _code(exc) != "NotFoundException":
                    raise
                found = None
            if found is None:
                entry.created = True
                if dry_run:
                    entry.associated = _resources(
                        settings, tenant, f"arn:aws:ses:REGION:ACCOUNT:tenant/{name}/-"
                    )
                    report.append(entry)
                    continue
                found = ses.create_tenant(TenantName=name, Tags=[{"Key": "fairpost-tenant", "Value": tenant}])
            entry.status = found.get("SendingStatus")
            wanted = _resources(settings, tenant, str(found["TenantArn"]))
            have = {
                r["ResourceArn"]
                for r in ses.list_tenant_resources(TenantName=name).get("TenantResources", [])
            }
            entry.extra = sorted(have - set(wanted))
            for arn in wanted:
                if arn in have:
                    continue
                entry.associated.append(arn)
                if not dry_run:
                    ses.create_tenant_resource_association(TenantName=name, ResourceArn=arn)
        except ClientError as exc:
            message = exc.response.get("Error", {}).get("Message", "")
            raise SesTenantError(f"SES tenant {name} (tenant {tenant}): {_code(exc)}: {message}") from None
        report.append(entry)
    return report


def set_customer_status(settings: Settings, tenant: str, *, enabled: bool) -> str:
    """``fairpost tenant pause|resume --ses``: the SES tenant's customer-managed status."""
    import contextlib

    import boto3

    name = settings.ses_tenant_for(tenant)
    if not name:
        raise SesTenantError(
            f"tenant {tenant} has no SES tenant (set ses_tenant_name or FAIRPOST_SES_TENANT_NAMES)"
        )
    status = "ENABLED" if enabled else "DISABLED"
    with contextlib.closing(boto3.client("sesv2")) as ses:
        try:
            arn = ses.get_tenant(TenantName=name)["Tenant"]["TenantArn"]
            ses.update_reputation_entity_customer_managed_status(
                ReputationEntityType="RESOURCE", ReputationEntityReference=arn, SendingStatus=status
            )
        except ClientError as exc:
            message = exc.response.get("Error", {}).get("Message", "")
            raise SesTenantError(f"SES tenant {name}: {_code(exc)}: {message}") from None
    return f"SES tenant {name}: customer-managed sending status {status}"
