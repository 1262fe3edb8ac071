"""A sending pool's settings and the rules across pools (#43; config/pools.py tells what a
pool is). Imported by config/settings.py, so it reads the settings only through
:class:`Pooled`: the pools, the key prefix, the queue."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode

from fairpost.config.durations import Duration
from fairpost.config.limits import GlobalLimits

__all__ = [
    "DEFAULT_POOL",
    "POOL_NAME_RULE",
    "PoolSettings",
    "Pooled",
    "ServePools",
    "check_pools",
    "fifo_queue_name",
    "is_valid_pool_name",
    "matching",
    "pool_key_prefix",
    "pool_names",
    "split_names",
]

DEFAULT_POOL = "default"
"""The pool the top-level settings describe; every tenant is on it until moved."""
POOL_NAME_RULE = "1 to 32 of a-z 0-9 _ -, starting with a letter"
_POOL_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_REGION = r"^[a-z]{2}(-[a-z]+)+-\d$"
_ROLE_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:role/[A-Za-z0-9+=,.@_/-]+$"
_FIFO_NAME = r"[A-Za-z0-9_-]{1,75}\.fifo"
_SHAPES = {
    "region": (_REGION, "must be an AWS region, such as eu-west-1"),
    "queue_name": (_FIFO_NAME, "must be an SQS FIFO queue name: 1 to 75 of A-Z a-z 0-9 _ -, then .fifo"),
    "queue_url": (
        r"https?://[^\s/]+/\d{1,12}/[A-Za-z0-9_-]{1,75}\.fifo",
        "must be an SQS FIFO queue URL: https://sqs.REGION.amazonaws.com/ACCOUNT/NAME.fifo",
    ),
}


def matching(value: str, pattern: str, rule: str) -> str:
    """``value`` if it matches ``pattern`` whole; else ValueError saying ``rule``."""
    if not re.fullmatch(pattern, value):
        raise ValueError(rule)
    return value


def fifo_queue_name(value: str) -> str:
    """An SQS FIFO queue's name (FAIRPOST_QUEUE_NAME's and each pool's), or ValueError."""
    return matching(value, *_SHAPES["queue_name"])


def is_valid_pool_name(name: str) -> bool:
    return _POOL_NAME.fullmatch(name) is not None


class PoolSettings(BaseModel):
    """One pool besides the default: where its mail goes and how much it may send.

    Anything left out is the default pool's: the region of ``AWS_DEFAULT_REGION``,
    the credentials of the process, the global limits of ``FAIRPOST_GLOBAL_LIMITS``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str | None = None
    """The pool's AWS region (SES and SQS); default: ``AWS_DEFAULT_REGION``."""
    queue_name: str | None = None
    """The pool's SQS FIFO queue, by name in its region and account."""
    queue_url: str | None = None
    """... or by URL (another account's queue); one of the two is set."""
    role_arn: str | None = Field(default=None, pattern=_ROLE_ARN)
    """A role to assume for the pool's SES and SQS calls (another account)."""
    external_id: str | None = Field(default=None, min_length=2, max_length=1224)
    """The ``ExternalId`` the role's trust policy asks for, if any."""
    profile: str | None = Field(default=None, min_length=1, max_length=128)
    """A named AWS profile (``~/.aws/config``) for the pool's calls."""
    access_key_id: str | None = Field(default=None, pattern=r"^[A-Z0-9]{16,128}$")
    secret_access_key: SecretStr | None = None
    """Static credentials (set with ``access_key_id``); prefer a role or a profile."""
    sqs_endpoint_url: str | None = Field(default=None, pattern=r"^https?://")
    """The pool's SQS endpoint (a VPC endpoint, an emulator); default: the region's."""
    ses_endpoint_url: str | None = Field(default=None, pattern=r"^https?://")
    """The pool's SES v2 endpoint (a VPC endpoint, an emulator); default: the region's."""
    global_limits: GlobalLimits | None = None
    """The pool's own quota, all its tenants together; ``auto``: its account's ``GetAccount``;
    default: the same as ``FAIRPOST_GLOBAL_LIMITS`` (counted apart: another account)."""
    configuration_set: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """The SES configuration set of the pool's mail, for tenants without one of their own."""
    events_queue_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,80}$")
    """The SQS standard queue the pool's SES events arrive in, in its account; unset: none read."""
    key_prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9:._-]{1,64}$")
    """The pool's Redis prefix and hash tag; default: ``<FAIRPOST_KEY_PREFIX>:pool:<name>``."""
    failover_after: Duration = Field(default=60.0, ge=1, le=86400)
    """How long the pool's SES must fail (5xx, unreachable; throttling is no failure) before
    the tenants that name a fallback pool send through it."""

    @field_validator("region", "queue_name", "queue_url")
    @classmethod
    def _shaped(cls, value: str | None, info: ValidationInfo) -> str | None:
        pattern, rule = _SHAPES[str(info.field_name)]
        return value if value is None else matching(value, pattern, rule)

    @model_validator(mode="after")
    def _complete(self) -> PoolSettings:
        if (self.queue_name is None) == (self.queue_url is None):
            raise ValueError("a pool names its SQS FIFO queue: queue_name or queue_url, one of the two")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key are set together")
        if self.profile is not None and self.access_key_id is not None:
            raise ValueError("a profile or static keys, not both")
        if self.external_id is not None and self.role_arn is None:
            raise ValueError("external_id goes with role_arn")
        return self

    def session_args(self) -> dict[str, Any]:
        """The pool's region and own credentials, as a boto3 or aioboto3 ``Session`` takes them."""
        secret = self.secret_access_key.get_secret_value() if self.secret_access_key else None
        return {
            "region_name": self.region,
            "profile_name": self.profile,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": secret,
        }

    def assume_role_args(self, session_name: str) -> dict[str, Any]:
        """STS ``AssumeRole``'s arguments for the pool's role (``role_arn`` must be set)."""
        args: dict[str, Any] = {"RoleArn": self.role_arn, "RoleSessionName": session_name}
        if self.external_id:
            args["ExternalId"] = self.external_id
        return args

    def queue_label(self) -> str:
        """The queue, as one string for messages: its URL, or its name."""
        return self.queue_url or str(self.queue_name)


ServePools = Annotated[tuple[str, ...] | None, NoDecode]
"""``FAIRPOST_SERVE_POOLS=default,eu``: the pools this replica runs; unset: every pool."""


def split_names(value: Any) -> Any:
    """``"default, eu"`` -> ``["default", "eu"]``; anything else as it is."""
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


class Pooled(Protocol):
    """What the pool rules read of the settings (config/settings.py's ``Settings``)."""

    @property
    def key_prefix(self) -> str: ...
    @property
    def queue_name(self) -> str: ...
    @property
    def pools(self) -> Mapping[str, PoolSettings]: ...
    @property
    def serve_pools(self) -> tuple[str, ...] | None: ...


def pool_key_prefix(settings: Pooled, name: str) -> str:
    """The key prefix (and hash tag) of a pool's keys: the default pool's is today's, exactly."""
    if name == DEFAULT_POOL:
        return settings.key_prefix
    pool = settings.pools[name]
    return pool.key_prefix or f"{settings.key_prefix}:pool:{name}"


def pool_names(settings: Pooled) -> tuple[str, ...]:
    """Every pool: the default first, then the declared ones in their order."""
    return (DEFAULT_POOL, *settings.pools)


def check_pools(settings: Pooled) -> tuple[str, str] | None:
    """What is wrong across the pools, as (variables, rule); None when nothing is.

    Two pools may share neither a key prefix (their keys would mix) nor a queue (a
    sender would receive the other pool's mail and find no job for it).
    """
    for name in settings.pools:
        var = f"FAIRPOST_POOLS__{name.upper()}"
        if name == DEFAULT_POOL:
            return (var, "the default pool is the top-level settings (FAIRPOST_QUEUE_NAME, ...): "
                    "declare other pools only")  # fmt: skip
        if not is_valid_pool_name(name):
            return (var, f"a pool name is {POOL_NAME_RULE}")
    prefixes: dict[str, str] = {}
    queues: dict[tuple[Any, ...], str] = {}
    for name in pool_names(settings):
        prefix = pool_key_prefix(settings, name)
        var = "FAIRPOST_KEY_PREFIX" if name == DEFAULT_POOL else f"FAIRPOST_POOLS__{name.upper()}__KEY_PREFIX"
        if prefix in prefixes:
            return (f"{prefixes[prefix]}, {var}", f"two pools share the key prefix {prefix!r}")
        prefixes[prefix] = var
        queue = _queue_identity(settings.pools.get(name), settings.queue_name)
        var = "FAIRPOST_QUEUE_NAME" if name == DEFAULT_POOL else f"FAIRPOST_POOLS__{name.upper()}__QUEUE_NAME"
        if queue in queues:
            return (f"{queues[queue]}, {var}", "two pools share one SQS queue (each pool needs its own)")
        queues[queue] = var
    if settings.serve_pools is not None:
        unknown = [p for p in settings.serve_pools if p not in pool_names(settings)]
        if unknown or not settings.serve_pools:
            return ("FAIRPOST_SERVE_POOLS", f"each must be a pool: one of {', '.join(pool_names(settings))}")
    return None


def _queue_identity(pool: PoolSettings | None, default_queue: str) -> tuple[Any, ...]:
    if pool is None:
        return ("name", None, default_queue, None, None, None, None)
    if pool.queue_url is not None:
        return ("url", pool.queue_url)
    account = (pool.role_arn, pool.profile, pool.access_key_id)
    return ("name", pool.region, pool.queue_name, pool.sqs_endpoint_url, *account)
