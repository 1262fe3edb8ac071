"""SES v2 tenants and reputation entities, for :class:`SesServer`.

The operations speak SES v2's REST-JSON exactly as botocore's ``sesv2``
model has them (paths, members, enums; timestamps as epoch seconds):

=========================================== ====== ===============================================
operation                                   method path
=========================================== ====== ===============================================
CreateTenant                                POST   /v2/email/tenants
GetTenant                                   POST   /v2/email/tenants/get
ListTenants                                 POST   /v2/email/tenants/list
CreateTenantResourceAssociation             POST   /v2/email/tenants/resources
DeleteTenantResourceAssociation             POST   /v2/email/tenants/resources/delete
ListTenantResources                         POST   /v2/email/tenants/resources/list
GetReputationEntity                         GET    /v2/email/reputation/entities/RESOURCE/{arn}
UpdateReputationEntityCustomerManagedStatus PUT    .../entities/RESOURCE/{arn}/customer-managed-status
=========================================== ====== ===============================================

A tenant's reputation entity is its ARN. :meth:`TenantBook.set_aws_status`
plays SES's own review (``DISABLED`` with a cause); while a tenant's
aggregate status is ``DISABLED``, a SendEmail naming it is refused with
``SendingPausedException`` naming the tenant (SES documents no dedicated
error; this is the assumption the tests make).

Events published for a mail: :mod:`fairpost.mailer.testing.ses_publishing`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

from fairpost.mailer.errors import RefusedRequest

ACCOUNT = "123456789012"
REGION = "us-east-1"
TENANTS_PATH = "/v2/email/tenants"
REPUTATION_PATH = "/v2/email/reputation/entities/"

Status = Literal["ENABLED", "REINSTATED", "DISABLED"]
_STATUSES = ("ENABLED", "REINSTATED", "DISABLED")


@dataclass
class Tenant:
    name: str
    tenant_id: str
    arn: str
    created: float
    tags: list[dict[str, str]] = field(default_factory=list)
    resources: dict[str, float] = field(default_factory=dict)
    """Resource ARN → when it was associated."""
    aws_status: Status = "ENABLED"
    aws_cause: str | None = None
    aws_updated: float = 0.0
    customer_status: Status = "ENABLED"
    customer_updated: float = 0.0

    @property
    def aggregate(self) -> Status:
        statuses = (self.aws_status, self.customer_status)
        if "DISABLED" in statuses:
            return "DISABLED"
        return "REINSTATED" if "REINSTATED" in statuses else "ENABLED"

    def summary(self) -> dict[str, Any]:
        return {
            "TenantName": self.name,
            "TenantId": self.tenant_id,
            "TenantArn": self.arn,
            "CreatedTimestamp": self.created,
        }


def resource_type(arn: str) -> str:
    resource = arn.split(":", 5)[-1]
    if resource.startswith("identity/"):
        return "EMAIL_IDENTITY"
    if resource.startswith("configuration-set/"):
        return "CONFIGURATION_SET"
    if resource.startswith("template/"):
        return "EMAIL_TEMPLATE"
    raise RefusedRequest(
        "BadRequestException", 400, "ResourceArn must name an identity, a configuration set or a template"
    )


class TenantBook:
    """The SES tenants of one :class:`SesServer`, and every call made on them."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.tenants: dict[str, Tenant] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        """(operation, request) for every tenant or reputation call, in order."""

    # -- what tests do ------------------------------------------------------------------
    def create(self, name: str) -> Tenant:
        with self._lock:
            if name in self.tenants:
                return self.tenants[name]
            tenant_id = "tn-" + uuid.uuid4().hex[:20]
            tenant = Tenant(
                name, tenant_id, f"arn:aws:ses:{REGION}:{ACCOUNT}:tenant/{name}/{tenant_id}", time.time()
            )
            self.tenants[name] = tenant
            return tenant

    def set_aws_status(self, name: str, status: Status, cause: str | None = None) -> None:
        """SES's own verdict on the tenant (its AWS-managed status)."""
        with self._lock:
            tenant = self.tenants[name]
            tenant.aws_status, tenant.aws_cause, tenant.aws_updated = status, cause, time.time()

    def aggregate(self, name: str) -> Status | None:
        with self._lock:
            tenant = self.tenants.get(name)
            return None if tenant is None else tenant.aggregate

    def calls_of(self, operation: str) -> list[dict[str, Any]]:
        with self._lock:
            return [request for op, request in self.calls if op == operation]

    # -- the wire ----------------------------------------------------------------------------
    def handles(self, path: str) -> bool:
        return path.startswith(TENANTS_PATH) or path.startswith(REPUTATION_PATH)

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        request = json.loads(body or b"{}") if method in ("POST", "PUT") else {}
        if not isinstance(request, dict):
            raise RefusedRequest("SerializationException", 400, "Expected a JSON object")
        with self._lock:
            if path.startswith(REPUTATION_PATH):
                return self._reputation(method, path[len(REPUTATION_PATH) :], request)
            route = {
                (TENANTS_PATH, "POST"): self._create_tenant,
                (TENANTS_PATH + "/get", "POST"): self._get_tenant,
                (TENANTS_PATH + "/list", "POST"): self._list_tenants,
                (TENANTS_PATH + "/resources", "POST"): self._associate,
                (TENANTS_PATH + "/resources/delete", "POST"): self._dissociate,
                (TENANTS_PATH + "/resources/list", "POST"): self._list_resources,
            }.get((path, method))
            if route is None:
                raise RefusedRequest("UnknownOperationException", 404, f"no operation {method} {path}")
            return route(request)

    def _record(self, operation: str, request: dict[str, Any]) -> None:
        self.calls.append((operation, request))

    def _named(self, request: dict[str, Any]) -> Tenant:
        name = request.get("TenantName")
        if not isinstance(name, str) or not name:
            raise RefusedRequest("BadRequestException", 400, "TenantName is required")
        tenant = self.tenants.get(name)
        if tenant is None:
            raise RefusedRequest("NotFoundException", 404, f"Tenant {name} does not exist.")
        return tenant

    def _create_tenant(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._record("CreateTenant", request)
        name = request.get("TenantName")
        if not isinstance(name, str) or not name:
            raise RefusedRequest("BadRequestException", 400, "TenantName is required")
        if name in self.tenants:
            raise RefusedRequest("AlreadyExistsException", 400, f"Tenant {name} already exists.")
        tenant = self.create(name)
        tenant.tags = list(request.get("Tags") or [])
        return 200, {**tenant.summary(), "Tags": tenant.tags, "SendingStatus": tenant.aggregate}

    def _get_tenant(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._record("GetTenant", request)
        tenant = self._named(request)
        return 200, {"Tenant": {**tenant.summary(), "Tags": tenant.tags, "SendingStatus": tenant.aggregate}}

    def _list_tenants(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._record("ListTenants", request)
        return 200, {"Tenants": [t.summary() for t in self.tenants.values()]}

    def _associate(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._record("CreateTenantResourceAssociation", request)
        tenant = self._named(request)
        arn = str(request.get("ResourceArn", ""))
        resource_type(arn)
        if arn in tenant.resources:
            raise RefusedRequest(
                "AlreadyExistsException", 400, "The resource is already associated with the tenant."
            )
        tenant.resources[arn] = time.time()
        return 200, {}

    def _dissociate(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._record("DeleteTenantResourceAssociation", request)
        tenant = self._named(request)
        if tenant.resources.pop(str(request.get("ResourceArn", "")), None) is None:
            raise RefusedRequest("NotFoundException", 404, "The resource is not associated with the tenant.")
        return 200, {}

    def _list_resources(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._record("ListTenantResources", request)
        tenant = self._named(request)
        return 200, {
            "TenantResources": [
                {"ResourceType": resource_type(a), "ResourceArn": a} for a in tenant.resources
            ]
        }

    def _reputation(self, method: str, rest: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        parts = rest.split("/")
        if len(parts) < 2 or parts[0] != "RESOURCE":
            raise RefusedRequest("BadRequestException", 400, "ReputationEntityType must be RESOURCE")
        arn = unquote(parts[1])
        tenant = next((t for t in self.tenants.values() if t.arn == arn), None)
        if method == "GET" and len(parts) == 2:
            self._record("GetReputationEntity", {"ReputationEntityReference": arn})
            if tenant is None:
                raise RefusedRequest("NotFoundException", 404, "The reputation entity does not exist.")
            return 200, {"ReputationEntity": _entity(tenant)}
        if method == "PUT" and parts[2:] == ["customer-managed-status"]:
            self._record(
                "UpdateReputationEntityCustomerManagedStatus", {"ReputationEntityReference": arn, **request}
            )
            status = request.get("SendingStatus")
            if status not in _STATUSES:
                raise RefusedRequest(
                    "BadRequestException", 400, "SendingStatus must be ENABLED, REINSTATED or DISABLED"
                )
            if tenant is None:
                raise RefusedRequest("BadRequestException", 400, "The reputation entity does not exist.")
            tenant.customer_status, tenant.customer_updated = status, time.time()
            return 200, {}
        raise RefusedRequest(
            "UnknownOperationException", 404, f"no operation {method} {REPUTATION_PATH}{rest}"
        )


def _entity(tenant: Tenant) -> dict[str, Any]:
    aws: dict[str, Any] = {
        "Status": tenant.aws_status,
        "LastUpdatedTimestamp": tenant.aws_updated or tenant.created,
    }
    if tenant.aws_cause:
        aws["Cause"] = tenant.aws_cause
    return {
        "ReputationEntityReference": tenant.arn,
        "ReputationEntityType": "RESOURCE",
        "ReputationManagementPolicy": f"arn:aws:ses:{REGION}:aws:reputation-policy/standard",
        "CustomerManagedStatus": {
            "Status": tenant.customer_status,
            "LastUpdatedTimestamp": tenant.customer_updated or tenant.created,
        },
        "AwsSesManagedStatus": aws,
        "SendingStatusAggregate": tenant.aggregate,
        "ReputationImpact": "LOW",
    }
