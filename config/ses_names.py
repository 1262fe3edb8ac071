"""SES tenant names derived from fairpost tenant ids (``FAIRPOST_SES_TENANT_NAMES=tenant_id``).

SES tenant names are 1 to 64 of ``[A-Za-z0-9_-]``; fairpost tenant ids also
allow ``.``. The rule, reversible and collision-free: every character but
``_`` and ``.`` is kept; ``_`` becomes ``_5F`` and ``.`` becomes ``_2E`` (an
underscore and the character's code in hex). So ``acme`` → ``acme``,
``acme.eu`` → ``acme_2Eeu``, ``a_b`` → ``a_5Fb``. Since every ``_`` in a name
starts an escape, two ids never map to one name. An id whose name would be
longer than 64 characters has no derived name: give it an ``ses_tenant_name``.
"""

from __future__ import annotations

import re

from fairpost.config.tenant_id import is_valid_tenant_id

MAX_SES_TENANT_NAME = 64
_ESCAPES = {"_": "_5F", ".": "_2E"}
_ESCAPED = re.compile(r"_(5F|2E)")


def ses_tenant_name(tenant_id: str) -> str | None:
    """The SES tenant name of a fairpost tenant id, or None if it would be too long."""
    if not is_valid_tenant_id(tenant_id):
        raise ValueError(f"not a tenant id: {tenant_id!r}")
    name = "".join(_ESCAPES.get(c, c) for c in tenant_id)
    return name if len(name) <= MAX_SES_TENANT_NAME else None


def tenant_id_of(ses_name: str) -> str:
    """The inverse of :func:`ses_tenant_name`."""
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), ses_name)
