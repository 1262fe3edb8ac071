"""What a tenant id may be.

The id becomes an SQS ``MessageGroupId``, an SES ``TenantName`` and part of
Redis keys, so it is held to the narrowest of the three.
"""

from __future__ import annotations

import re

TENANT_ID_RULE = "1 to 64 characters from A-Z, a-z, 0-9, '.', '_' and '-'"
_TENANT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def is_valid_tenant_id(value: object) -> bool:
    return isinstance(value, str) and _TENANT_ID.fullmatch(value) is not None
