"""The sections of fairpost's settings (``FAIRPOST_<SECTION>__<FIELD>``), each a frozen
model that refuses unknown fields: what :class:`fairpost.config.settings.Settings`
is made of."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
)
from pydantic_settings import (
    NoDecode,
)

from fairpost.config.durations import Duration, Schedule
from fairpost.config.limits import Limits, parse_limits
from fairpost.config.providers import PROVIDERS
from fairpost.config.warmup import WarmupPlanSetting


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TenantSettings(_Section):
    """Per-tenant overrides; anything left out falls back to the defaults."""

    limits: Limits | None = None
    weight: int | None = Field(default=None, ge=1, le=1000)
    inflight_cap: int | None = Field(default=None, ge=1, le=10_000)
    notification_limits: Limits | None = None
    """Its notification mail's own limits, within (and counted in) its ``limits``."""
    ses_tenant_name: str | None = None
    configuration_set: str | None = None
    notification_configuration_set: str | None = None
    """The SES configuration set of its notification mail (its own event destination,
    its own dedicated IPs); default: ``configuration_set``."""
    default_sender: str | None = None
    ses_identities: tuple[str, ...] = ()
    """The SES identities (domains or addresses) the tenant sends from, associated with
    its SES tenant by ``fairpost ses-tenants sync``; default: its default_sender's domain."""

    @field_validator("ses_tenant_name")
    @classmethod
    def _ses_tenant_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value):
            raise ValueError("must be an SES tenant name: 1 to 64 of A-Z a-z 0-9 _ -")
        return value

    @field_validator("default_sender")
    @classmethod
    def _sender_address(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from email.utils import parseaddr

        from email_validator import EmailNotValidError, validate_email

        address = parseaddr(value)[1]
        if not address.rpartition("@")[0].isascii():
            # SES takes no internationalised local part: every mail from it would be refused.
            raise ValueError("the part before the @ must be 7-bit ASCII, as SES takes it")
        try:
            validate_email(address, check_deliverability=False)
        except EmailNotValidError as exc:
            raise ValueError(f"not a valid e-mail address: {exc}") from None
        return value


class RedisIamSettings(_Section):
    """IAM authentication to ElastiCache or MemoryDB (fairpost.dispatcher.iam): each new
    connection authenticates as ``user`` with a fresh SigV4 token (it lives 15 minutes),
    signed with the process's AWS credentials; needs botocore (``fairpost[iam]``)."""

    user: str = Field(min_length=1, max_length=128)
    """The IAM-enabled Redis user (its user id, which must equal its user name)."""
    cache_name: str = Field(pattern=r"^[A-Za-z0-9-]{1,128}$")
    """ElastiCache: the replication group or serverless cache; MemoryDB: the cluster name."""
    service: Literal["elasticache", "memorydb"] = "elasticache"
    serverless: bool = False
    """An ElastiCache serverless cache (the token names ``ResourceType=ServerlessCache``)."""
    region: str | None = Field(default=None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    """The cache's region; default: the one the AWS variables name (``AWS_DEFAULT_REGION``)."""
    max_connection_age: Duration = Field(default=11 * 3600.0, gt=0, le=12 * 3600.0)
    """A connection older than this is replaced (with a new token) when next taken from its
    pool: ElastiCache cuts IAM connections after 12 hours."""


class DispatcherSettings(_Section):
    concurrency: int = Field(default=100, ge=1, le=10_000)
    """Jobs one dispatcher process works on at once, all tenants together."""
    batch_size: int = Field(default=50, ge=1, le=100)
    """Jobs claimed per Redis round trip (handed to SQS ten at a time). Fifty, not
    ten: a claim's fixed cost and a tenant's turn (five commands, a turn a job while
    the ring holds more tenants than the claim wants jobs) are paid once for more
    jobs (issue #41)."""
    linger_seconds: float = Field(default=0.05, ge=0, le=5)
    """After a claim that did not fill a batch, how long to wait for more jobs
    before handing off: fuller SQS batches, fewer calls, a little latency. Up to
    twice as long when the recent rate says the batch fills by then
    (dispatcher/linger.py)."""
    lease_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How long a claim holds before another replica may take the job back."""
    inflight_ttl_seconds: float = Field(default=1800.0, gt=0, le=14 * 86400)
    """How long a job handed to SQS holds its tenant's in-flight slot unless
    the sender touches it again; a floor against slots lost with their
    messages, not the normal way slots come back."""


class SenderSettings(_Section):
    concurrency: int = Field(default=16, ge=1, le=1000)
    """SES calls in flight at once in one process."""
    linger_seconds: float = Field(default=0.15, ge=0, le=5)
    """After a receive that brought fewer than 10 messages, how long to let more
    gather before the next one: fuller receives and deletes, a little latency."""
    receivers: int = Field(default=2, ge=1, le=64)
    """SQS receive loops in one process; each long-polls for up to 10 messages."""
    pause_seconds: float = Field(default=60.0, gt=0, le=3600)
    """How long the sender stops when SES says sending is paused or credentials fail."""
    wait_seconds: int = Field(default=20, ge=1, le=20)
    """SQS long-poll wait (at least 1 s: a zero wait on an empty queue is a busy loop)."""
    visibility_timeout: int = Field(default=60, ge=5, le=43_200)
    """Seconds a received message stays hidden while it is being sent."""
    max_attempts: int = Field(default=5, ge=1, le=100)
    """Transient failures before a job becomes a dead letter."""
    backoff_base_seconds: float = Field(default=2.0, gt=0, le=3600)
    backoff_max_seconds: float = Field(default=900.0, gt=0, le=43_200)
    max_jitter_seconds: float = Field(default=1.0, ge=0, le=60)
    """Added to a quota wait so paused groups do not all wake at once."""


class ReputationSettings(_Section):
    """The reputation guard (mailer/quota/reputation.py) and SES's verdict on tenants."""

    bounce_threshold: float = Field(default=0.04, gt=0, le=1)
    """Hard-bounce rate (bounced recipients / recipients sent) at which a tenant is paused;
    SES reviews an account at about 5 %."""
    complaint_threshold: float = Field(default=0.0008, gt=0, le=1)
    """Complaint rate at which a tenant is paused; SES reviews an account at about 0.1 %."""
    min_sends: int = Field(default=200, ge=1, le=1_000_000)
    """A rate is counted over at least this many sends: with fewer, the denominator is
    this, so a tenant's first bounces weigh as they would among that many sends."""
    throttle_at: float = Field(default=0.5, gt=0, le=1)
    """At this share of a threshold the guard throttles the tenant to ``throttle_limits``."""
    throttle_limits: Limits = parse_limits("1/second")
    """The limits a throttled tenant gets (a live override, lifted with the throttle)."""
    ses_status_refresh: float = Field(default=60.0, ge=1, le=86400)
    """Seconds between GetReputationEntity reads of a tenant with mail waiting (and of a
    tenant SES disabled, until it is enabled again)."""
    per_provider: bool = False
    """The guard per mailbox provider (mailer/quota/provider_guard.py): a tenant whose
    bounce or complaint rate at one provider crosses a threshold is held for that
    provider only; its mail to the others goes on."""
    provider_min_sends: int = Field(default=100, ge=1, le=1_000_000)
    """A provider's rates are counted over at least this many sends to it (fewer count as
    this many), so a few bounces among a few sends hold nobody."""
    provider_recheck_seconds: float = Field(default=60.0, ge=1, le=3600)
    """How often a provider hold is judged again (and lifted once the rates are back
    under), and how long a held mail not yet in SQS waits before it is looked at again."""


class WarmupSettings(_Section):
    """Warm-up plans (docs/operations.md, "Warm-up"; config/warmup.py, mailer/quota/warmup.py)."""

    plan: WarmupPlanSetting = None
    """The plan a tenant fairpost has not seen before starts at its first mail; empty: none."""
    bounce_threshold: float = Field(default=0.02, gt=0, le=1)
    """A warming tenant's step advances only while its bounce rate (the guard's) is below this."""
    complaint_threshold: float = Field(default=0.0005, gt=0, le=1)
    """... and its complaint rate below this."""


class DeliverabilitySettings(_Section):
    """Per-tenant deliverability by mailbox provider (docs/operations.md, "Deliverability")."""

    enabled: bool = True
    """Count each tenant's outcomes per day and mailbox provider (one script call per
    group of sends or per SES event) and its sends per minute over the last hour."""
    providers: Annotated[tuple[str, ...], NoDecode] = tuple(p.name for p in PROVIDERS)
    """The providers counted by name (``gmail,outlook``: of config/providers.py's); every
    other is ``other``."""
    retention_days: int = Field(default=15, ge=1, le=400)
    """How long a tenant's day of counts is kept (the console shows 14 days and today)."""
    mx_cache_seconds: Duration = Field(default=3600.0, ge=1, le=7 * 86400)
    """How long a domain's provider, read from its MX records, is trusted."""
    mx_cache_size: int = Field(default=10_000, ge=1, le=1_000_000)
    """Domains whose provider each process remembers (the least recently used go first)."""
    mx_timeout_seconds: float = Field(default=1.0, gt=0, le=30)
    """An MX lookup not answered within this counts the domain by its name alone."""
    metrics_tenant: bool = False
    """Also label ``fairpost_deliverability_tenant_total`` by tenant (bounded like every
    tenant label, FAIRPOST_METRICS_TENANT_LABELS); off: by provider and outcome only."""

    @field_validator("providers", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value

    @field_validator("providers")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = [p.name for p in PROVIDERS]
        unknown = [v for v in value if v not in names]
        if unknown:
            raise ValueError(f"unknown provider {unknown[0]!r}: each must be one of {', '.join(names)}")
        return tuple(dict.fromkeys(value))


CONSOLE_VARIABLES = {
    "port": "FAIRPOST_CONSOLE_PORT",
    "host": "FAIRPOST_CONSOLE_HOST",
    "prefix": "FAIRPOST_CONSOLE_PREFIX",
    "token": "FAIRPOST_CONSOLE_TOKEN",
    "write": "FAIRPOST_CONSOLE_WRITE",
    "show_addresses": "FAIRPOST_CONSOLE_SHOW_ADDRESSES",
}
"""The console's variables, by field: one underscore, the names its docs give
(``FAIRPOST_CONSOLE__PORT``, the nested form, works too)."""


class ConsoleSettings(_Section):
    """``fairpost console`` (mailer/console): the operator's web console."""

    port: int = Field(default=8025, ge=1, le=65535)
    """Where it listens; never the daemon's ``http_port``."""
    host: str = "127.0.0.1"
    """The address it binds: this machine only by default (``0.0.0.0``: every
    interface, as a pod behind a Service needs; deploy/kubernetes/console.yaml sets it)."""
    prefix: str = Field(default="", pattern=r"^(/[A-Za-z0-9._~-]+)*/?$")
    """The path it is served under behind a reverse proxy (``/fairpost``), passed on as is."""
    token: SecretStr | None = None
    """The secret an operator logs in with (or sends as ``Authorization: Bearer``);
    the console refuses to start without one."""
    write: bool = False
    """Whether actions (pause, quota, replay, ...) are allowed; read-only otherwise."""
    show_addresses: bool = False
    """Show recipient addresses in full; masked (``a***@example.com``) otherwise."""

    @field_validator("prefix")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (a random secret: openssl rand -hex 32)")
        return value


class OutcomeSettings(_Section):
    """The outcome feed (docs/outcomes.md): what became of each mail, in one Redis stream."""

    enabled: bool = True
    """Append an event for each outcome (sent, delivered, bounced, dead, ...)."""
    max_age: Duration = 86400.0
    """Events older than this are trimmed (``1d``); a consumer away longer misses them.
    A feed, not an archive: status() answers from each mail's record and history
    (docs/operations.md, "Redis memory per sent mail"), and a day of events costs
    Redis about 32 bytes a mail kept a week, where a week would cost 225."""
    max_length: int = Field(default=1_000_000, ge=1000, le=100_000_000)
    """At most about this many events are kept, whatever their age."""


_HTTPS_BASE = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[^\s<>,]*)?")
_DOMAIN = re.compile(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")


class UnsubscribeSettings(_Section):
    """One-click unsubscribe of notification mail (docs/unsubscribe.md): the signed
    tokens the SDK puts in ``List-Unsubscribe``, and ``fairpost unsubscribe-server``."""

    keys: tuple[SecretStr, ...] = ()
    """Token keys, newest first: the first signs, every one verifies (rotate by putting a
    new key first and dropping the old one once its tokens have expired)."""
    base_url: str | None = None
    """Where ``fairpost unsubscribe-server`` faces the internet: links are ``<base_url>/u/<token>``."""
    mailto_domain: str | None = None
    """A domain whose mail SES receives into the events queue: adds ``<mailto:u-<token>@domain>``."""
    token_days: int = Field(default=90, ge=1, le=3650)
    """How long a link works after its mail was enqueued."""
    host: str = "0.0.0.0"
    port: int = Field(default=8026, ge=1, le=65535)
    rate_per_minute: int = Field(default=30, ge=1, le=100_000)
    """Requests one client address may make a minute (more get 429)."""

    @field_validator("keys")
    @classmethod
    def _long_keys(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        if any(len(k.get_secret_value()) < 32 for k in value):
            raise ValueError("each key must be at least 32 characters (openssl rand -hex 32)")
        return value

    @field_validator("base_url")
    @classmethod
    def _https_url(cls, value: str | None) -> str | None:
        if value is not None and not _HTTPS_BASE.fullmatch(value):
            raise ValueError(
                "must be an https:// URL (a host, an optional port and path; no spaces, <, > or ,): "
                "where fairpost unsubscribe-server faces the internet"
            )
        return value.rstrip("/") if value else value

    @field_validator("mailto_domain")
    @classmethod
    def _domain(cls, value: str | None) -> str | None:
        if value is not None and not _DOMAIN.fullmatch(value):
            raise ValueError(
                "must be a domain name (letters, digits, '-' and '.'), such as unsubscribe.example.com"
            )
        return value


WEBHOOK_VARIABLES = {
    name: "FAIRPOST_WEBHOOK_" + name.upper()
    for name in (
        "enabled", "retry_schedule", "timeout_seconds", "rotation_overlap", "disable_after",
        "allow_private", "concurrency", "endpoint_concurrency",
    )
}  # fmt: skip
"""The webhook section's variables, by field: one underscore, as docs/outcomes.md names them."""


class WebhookSettings(_Section):
    """Signed webhook deliveries of the outcome feed (docs/outcomes.md, mailer/daemon/webhooks)."""

    enabled: bool = True
    """Run the delivery task in ``fairpost run`` (roles ``all`` and ``webhooks``)."""
    retry_schedule: Schedule = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 50400.0, 72000.0, 86400.0)
    """The waits before each retry of a failed delivery; jitter adds up to a tenth of each."""
    timeout_seconds: float = Field(default=15.0, gt=0, le=300)
    """A delivery not answered within this fails (and is retried)."""
    rotation_overlap: Duration = 86400.0
    """After ``rotate-secret``, how long the previous secret still signs too."""
    disable_after: Duration = 5 * 86400.0
    """An endpoint failing every attempt for this long is disabled."""
    allow_private: bool = False
    """Allow ``http://`` and private addresses (a receiver in the cluster, tests); SSRF-unsafe."""
    concurrency: int = Field(default=64, ge=1, le=10_000)
    """Deliveries in flight at once in one process, all endpoints together."""
    endpoint_concurrency: int = Field(default=4, ge=1, le=1000)
    """Deliveries in flight at once to one endpoint, all replicas together."""
