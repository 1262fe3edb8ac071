"""Everything an operator tunes, in one model.

Read once at start-up from ``FAIRPOST_*`` environment variables (nested with
``__``) and an optional TOML file named by ``FAIRPOST_CONFIG_FILE``; the
environment wins over the file. AWS access is deliberately absent: boto3
reads ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL*`` and the credentials chain
itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from fairpost.config.durations import Duration
from fairpost.config.errors import ConfigError
from fairpost.config.limits import GlobalLimits, Limits, parse_limits
from fairpost.config.pool_model import PoolSettings, ServePools, check_pools, fifo_queue_name, split_names
from fairpost.config.sections import (
    CONSOLE_VARIABLES,
    WEBHOOK_VARIABLES,
    ConsoleSettings,
    DeliverabilitySettings,
    DispatcherSettings,
    OutcomeSettings,
    RedisIamSettings,
    ReputationSettings,
    SenderSettings,
    TenantSettings,
    UnsubscribeSettings,
    WarmupSettings,
    WebhookSettings,
)
from fairpost.config.ses_names import ses_tenant_name
from fairpost.config.sources import ConsoleEnvSource, TomlFileSource
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id

ENV_PREFIX = "FAIRPOST_"
# Read by the set-up scripts (scripts/bootstrap.sh, scripts/install-localstack.sh),
# not by fairpost itself: not settings, but not typos either.
SETUP_VARIABLES = frozenset({"FAIRPOST_PYTHON", "FAIRPOST_LOCALSTACK_PYTHON", "FAIRPOST_LOCALSTACK_VENV"})


class Settings(BaseSettings):
    """fairpost's settings. Build with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    """One server; with ``redis_cluster``: any node; with ``redis_sentinels``: only the
    credentials, database and TLS (``rediss://``) of the data nodes (Sentinel names the host)."""
    redis_timeout: float = Field(default=5.0, gt=0, le=300)
    """Seconds the SDK waits for Redis to answer a command before it raises
    :class:`mailer.RedisFailed` (a Redis that stops answering must not hang the application)."""
    redis_connect_timeout: float = Field(default=2.0, gt=0, le=60)
    """Seconds the SDK waits for a connection to Redis."""
    redis_retry_seconds: float = Field(default=10.0, ge=0, le=3600)
    """How long the SDK tries a call again, backing off, while Redis is away (a
    restart, a failover) before it raises :class:`mailer.RedisFailed`; 0: never."""
    redis_cluster: bool = False
    """A Redis Cluster (or ElastiCache cluster mode enabled): ``redis_url`` names any node."""
    redis_sentinels: str | None = None
    """``host:port,host:port``: the master is found through these sentinels."""
    redis_sentinel_master: str | None = None
    """The name the sentinels monitor the master under."""
    redis_sentinel_password: SecretStr | None = None
    """The sentinels' own password (``requirepass`` in sentinel.conf), if they have one."""
    redis_sentinel_tls: bool = False
    """Talk to the sentinels over TLS (the data nodes: ``rediss://`` in ``redis_url``)."""
    redis_tls_ca_file: Path | None = None
    """With ``rediss://`` (or ``redis_sentinel_tls``): the CA certificates (PEM) that Redis's
    certificate must chain to; default: the system's (enough for ElastiCache and MemoryDB)."""
    redis_iam: RedisIamSettings | None = None
    """IAM authentication (ElastiCache, MemoryDB): ``FAIRPOST_REDIS_IAM__USER``,
    ``FAIRPOST_REDIS_IAM__CACHE_NAME``...; ``redis_url`` then carries no user or password."""
    redis_min_replicas: int = Field(default=0, ge=0, le=16)
    """Replicas that must have a write the product relies on (an enqueue, a "sent"
    record, a quota grant) before fairpost acts on it (Redis ``WAIT``); 0: none."""
    redis_wait_seconds: float = Field(default=1.0, gt=0, le=60)
    """How long such a write waits for ``redis_min_replicas`` replicas before it counts as failed."""
    redis_high_water: float = Field(default=0.85, gt=0, le=1)
    """Above this share of Redis's ``maxmemory`` the SDK refuses new mail (a retriable
    :class:`RedisNearlyFull`) so that the daemon keeps room to drain and Redis never
    evicts (docs/design.md, "Redis memory"); 1: refuse only at the limit itself."""
    redis_memory_check_seconds: float = Field(default=30.0, ge=1, le=3600)
    """How often the daemon reads Redis's memory and eviction policy again while it runs."""
    key_prefix: str = Field(default="fairpost", pattern=r"^[A-Za-z0-9:._-]{1,64}$")
    queue_name: str = "fairpost-mail.fifo"
    config_file: Path | None = None

    global_limits: GlobalLimits = parse_limits("14/second; 50000/day")
    """All tenants together; "auto": derived from SES GetAccount (see ``ses_safety_factor``)."""
    ses_safety_factor: float = Field(default=0.9, gt=0, le=1)
    """With ``global_limits = "auto"``: the share of SES's quotas fairpost may use."""
    ses_account_refresh: float = Field(default=300.0, ge=1, le=86400)
    """With ``global_limits = "auto"``: seconds between GetAccount calls."""
    tenant_limits: Limits = parse_limits("5/second; 10000/day")
    notification_limits: Limits | None = None
    """Every tenant's notification mail, within its tenant's limits, unless the tenant
    has its own (``tenants.<id>.notification_limits``); None: only the tenant's limits."""
    default_weight: int = Field(default=1, ge=1, le=1000)
    inflight_cap: int = Field(default=20, ge=1, le=10_000)
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    pools: dict[str, PoolSettings] = Field(default_factory=dict)
    """Sending pools besides the default (config/pools.py): ``FAIRPOST_POOLS__EU__REGION``..."""
    configuration_set: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """The SES configuration set of mail whose tenant names none of its own; unset: none."""
    serve_pools: ServePools = None
    """The pools this replica runs (``default,eu``); unset: every pool."""

    max_message_bytes: int = Field(default=10_000_000, ge=1024, le=40_000_000)
    """Largest mail (subject, bodies, headers, addresses; with attachments: the
    whole MIME message, base64 and all) the SDK accepts. Up to SES v2's 40 MB: a
    mail too big for an SQS message travels as a claim check (its content stays
    in Redis until it is sent). The default, 10 MB, takes attachments of about
    7 MB (an invoice, a report), as most mail providers do."""

    job_ttl: int = Field(default=7 * 86400, ge=60, le=365 * 86400)
    """Seconds a finished job's record is kept (FAIRPOST_JOB_TTL)."""
    job_detail_ttl: int = Field(default=86400, ge=60, le=365 * 86400)
    """Seconds a sent mail's whole record is kept (FAIRPOST_JOB_DETAIL_TTL); after it,
    until FAIRPOST_JOB_TTL, a short line in a day's history bucket answers status()
    (docs/operations.md, "Redis memory per sent mail"). At FAIRPOST_JOB_TTL or over:
    the whole record for FAIRPOST_JOB_TTL, no history."""
    history_shards: int = Field(default=16, ge=1, le=1_000_000)
    """The fewest buckets a day in the history of sent mail (FAIRPOST_HISTORY_SHARDS):
    each day takes one for each 256 mails sent the day before, at least this many,
    so that a bucket stays within Redis's ``hash-max-listpack-entries`` (512 by
    default). Set it to a day's mails / 256 for a first day of high volume."""
    ses_index_ttl: int = Field(default=86400, ge=60, le=365 * 86400)
    """Seconds a sent mail's SES message id leads SES events to it
    (FAIRPOST_SES_INDEX_TTL; never longer than FAIRPOST_JOB_TTL). Needed only by
    events that do not carry the mail's tags (identity feedback notifications):
    those of a configuration set's event destination, as docs/operations.md sets
    them up, name the job and tenant themselves, whenever they come. Bounces come
    within minutes to hours, most complaints within a day; a later one without
    tags is counted ``unmatched``."""
    idempotency_ttl: int = Field(default=86400, ge=1, le=365 * 86400)
    """Seconds an idempotency key keeps returning its first job's id (FAIRPOST_IDEMPOTENCY_TTL)."""

    reconcile_handoffs: int = Field(default=3, ge=0, le=100)
    """Times a dispatched job whose SQS message is gone (a redrive policy, a purge,
    the retention period) is handed to SQS again before it becomes a dead letter."""

    dispatcher: DispatcherSettings = DispatcherSettings()
    sender: SenderSettings = SenderSettings()
    reputation: ReputationSettings = ReputationSettings()
    warmup: WarmupSettings = WarmupSettings()
    console: ConsoleSettings = ConsoleSettings()
    outcomes: OutcomeSettings = OutcomeSettings()
    webhook: WebhookSettings = WebhookSettings()
    deliverability: DeliverabilitySettings = DeliverabilitySettings()
    unsubscribe: UnsubscribeSettings = UnsubscribeSettings()

    events_queue_name: str | None = None
    """The SQS queue SES events arrive in (through SNS or EventBridge); unset: none read."""
    ses_tenant_names: Literal["configured", "tenant_id"] = "configured"
    """``configured``: a tenant's SES tenant is its ``ses_tenant_name`` (none if unset);
    ``tenant_id``: every tenant without one gets an SES tenant named after its id
    (config/ses_names.py gives the rule)."""

    http_port: int | None = Field(default=None, ge=1, le=65535)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    shutdown_grace: float = Field(default=8.0, ge=0, le=300)
    failover_after: Duration = Field(default=60.0, ge=1, le=86400)
    """How long the default pool's SES must fail (5xx, unreachable; not throttling) before
    the tenants that name a fallback pool send through it (each pool has its own)."""
    max_outage_seconds: float = Field(default=60.0, gt=0, le=3600)
    """How long the dispatcher and the sender ride out failing Redis or AWS calls
    (backing off) before the daemon exits non-zero for its supervisor to restart it."""
    replica_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    """Names this replica's heartbeat; default: the host name (the container id in Docker)."""
    metrics_tenant_labels: int = Field(default=50, ge=0, le=10_000)
    """Tenants, beyond those configured in ``tenants``, that get their own metrics label."""
    trace_parent: bool = False
    """With tracing on (the ``OTEL_*`` variables, docs/operations.md "Tracing"): the span
    of a received mail's processing is a child of the application's span, not only linked
    to it."""

    @field_validator("tenants")
    @classmethod
    def _tenant_ids(cls, value: dict[str, TenantSettings]) -> dict[str, TenantSettings]:
        for tenant_id in value:
            if not is_valid_tenant_id(tenant_id):
                raise ValueError(f"tenant id {tenant_id!r} must be {TENANT_ID_RULE}")
        return value

    @field_validator("serve_pools", mode="before")
    @classmethod
    def _split_pools(cls, value: Any) -> Any:
        return split_names(value)

    @model_validator(mode="after")
    def _pools_apart(self) -> Settings:
        """Pools that would mix their keys or queues, naming the variables involved."""
        problem = check_pools(self)
        if problem is not None:
            raise PydanticCustomError("pools", "{rule}", {"variables": problem[0], "rule": problem[1]})
        return self

    @field_validator("queue_name")
    @classmethod
    def _fifo_queue_name(cls, value: str) -> str:
        return fifo_queue_name(value)

    @field_validator("events_queue_name")
    @classmethod
    def _events_queue_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", value):
            raise ValueError("must be an SQS standard queue name: 1 to 80 of A-Z a-z 0-9 _ -")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        if urlsplit(value).scheme not in {"redis", "rediss", "unix"}:
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("redis_tls_ca_file")
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{str(value)!r} is not a file (the CA certificates, PEM)")
        return value

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinel_list(cls, value: str | None) -> str | None:
        if value is not None and not _parse_addresses(value):
            raise ValueError(
                "must be host:port pairs separated by commas (sentinel-1:26379,sentinel-2:26379)"
            )
        return value

    @model_validator(mode="after")
    def _one_topology(self) -> Settings:
        """Bad combinations of the Redis topology settings, naming every variable involved."""
        url, cluster, sentinels = "FAIRPOST_REDIS_URL", "FAIRPOST_REDIS_CLUSTER", "FAIRPOST_REDIS_SENTINELS"
        master = "FAIRPOST_REDIS_SENTINEL_MASTER"
        scheme = urlsplit(self.redis_url).scheme
        problem: tuple[str, str] | None = None
        if self.redis_cluster and self.redis_sentinels:
            problem = (f"{cluster}, {sentinels}", "a cluster or Sentinel, not both")
        elif bool(self.redis_sentinels) != bool(self.redis_sentinel_master):
            problem = (f"{sentinels}, {master}", "are set together: the sentinels and the master name")
        elif not self.redis_sentinels and (self.redis_sentinel_password or self.redis_sentinel_tls):
            problem = (
                f"FAIRPOST_REDIS_SENTINEL_PASSWORD, FAIRPOST_REDIS_SENTINEL_TLS, {sentinels}",
                "sentinel password and TLS apply only with sentinels",
            )
        elif (self.redis_cluster or self.redis_sentinels) and scheme == "unix":
            problem = (
                f"{url}, {cluster if self.redis_cluster else sentinels}",
                "a unix:// socket is one server",
            )
        elif self.redis_cluster and urlsplit(self.redis_url).path.strip("/") not in ("", "0"):
            problem = (f"{url}, {cluster}", "a cluster has only database 0")
        elif self.redis_tls_ca_file is not None and scheme != "rediss" and not self.redis_sentinel_tls:
            problem = (f"FAIRPOST_REDIS_TLS_CA_FILE, {url}", "a CA file is for TLS: a rediss:// URL")
        elif self.redis_iam is not None and self.redis_sentinels:
            problem = (
                f"FAIRPOST_REDIS_IAM__USER, {sentinels}",
                "IAM is ElastiCache's and MemoryDB's: no Sentinel",
            )
        elif self.redis_iam is not None and scheme != "rediss":
            problem = (f"FAIRPOST_REDIS_IAM__USER, {url}", "IAM authentication needs TLS: a rediss:// URL")
        elif self.redis_iam is not None and urlsplit(self.redis_url).username is not None:
            problem = (
                f"FAIRPOST_REDIS_IAM__USER, {url}",
                "with IAM the user is FAIRPOST_REDIS_IAM__USER and the password a token: "
                "no user or password in the URL",
            )
        elif self.redis_min_replicas and self.redis_wait_seconds >= self.redis_timeout:
            problem = (
                "FAIRPOST_REDIS_WAIT_SECONDS, FAIRPOST_REDIS_TIMEOUT",
                "the wait for replicas must end before the command's timeout",
            )
        if problem is not None:
            raise PydanticCustomError("topology", "{rule}", {"variables": problem[0], "rule": problem[1]})
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, ConsoleEnvSource(settings_cls), TomlFileSource(settings_cls))

    # -- derived views ----------------------------------------------------

    def tenant(self, tenant_id: str) -> TenantSettings:
        """The tenant's own settings; with ``ses_tenant_names = "tenant_id"``, its
        ``ses_tenant_name`` filled in from its id when it has none of its own; and the
        ``configuration_set`` (a pool's) when it names none."""
        own = self.tenants.get(tenant_id) or _NO_OVERRIDES
        update: dict[str, str] = {}
        named = ses_tenant_name(tenant_id) if self.ses_tenant_names == "tenant_id" else None
        if not own.ses_tenant_name and named:
            update["ses_tenant_name"] = named
        if not own.configuration_set and self.configuration_set:
            update["configuration_set"] = self.configuration_set
        return own.model_copy(update=update) if update else own

    def limits_for(self, tenant_id: str) -> Limits:
        return self.tenant(tenant_id).limits or self.tenant_limits

    def notification_limits_for(self, tenant_id: str) -> Limits | None:
        return self.tenant(tenant_id).notification_limits or self.notification_limits

    def ses_tenant_for(self, tenant_id: str) -> str | None:
        """The SES tenant (``TenantName``) the tenant's mail is sent under, if any."""
        return self.tenant(tenant_id).ses_tenant_name

    def weight_for(self, tenant_id: str) -> int:
        return self.tenant(tenant_id).weight or self.default_weight

    def inflight_cap_for(self, tenant_id: str) -> int:
        """The tenant's own cap, or the default scaled by its weight against the
        default weight: a tenant meant to send four times as much needs four
        times the mail in flight."""
        scale = -(-self.weight_for(tenant_id) // self.default_weight)  # ceiling division
        return self.tenant(tenant_id).inflight_cap or self.inflight_cap * max(1, scale)

    def stranded_after_seconds(self) -> float:
        """The longest a dispatched job can legitimately go without a sign of progress.

        Its signs are its hand-off, every park of its tenant (which keeps the
        tenant's in-flight slots until the park ends plus the in-flight TTL) and,
        while no sender receives (the global quota spent, SES throttling or a
        pause: mailer/daemon/slots.py), every pass of the slot keeper. Past the
        last one it may still wait: the in-flight TTL (in SQS behind its group's
        other mail), the visibility timeout (a received message in its SES call)
        and the longest retry delay (after a transient failure). Past all of
        that, SQS no longer holds its message.
        """
        return (
            self.dispatcher.inflight_ttl_seconds
            + self.sender.visibility_timeout
            + self.sender.backoff_max_seconds
        )

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``redis_sentinels`` as (host, port) pairs; empty without sentinels."""
        return _parse_addresses(self.redis_sentinels or "")

    def redacted(self) -> dict[str, Any]:
        """The effective settings, safe to print: passwords masked."""
        data = self.model_dump(mode="json")
        data["redis_url"] = mask_url(self.redis_url)
        return data


_NO_OVERRIDES = TenantSettings()


def _parse_addresses(text: str) -> list[tuple[str, int]]:
    """``"a:26379, b:26379"`` -> [("a", 26379), ("b", 26379)]; [] if any part is malformed."""
    out = []
    for part in text.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            return []
        out.append((host.strip("[]"), int(port)))
    return out


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, or raise :class:`ConfigError` naming each bad variable."""
    unknown = sorted(
        name
        for name in os.environ
        if name.startswith(ENV_PREFIX)
        and name not in SETUP_VARIABLES
        and name not in CONSOLE_VARIABLES.values()
        and name not in WEBHOOK_VARIABLES.values()
        and name[len(ENV_PREFIX) :].split("__")[0].lower() not in Settings.model_fields
    )
    if unknown:
        raise ConfigError([(name, "is not a fairpost setting (check the spelling)") for name in unknown])
    try:
        return Settings(**overrides)
    except SettingsError as exc:
        # Raised before validation, when a variable holding a table is not valid JSON.
        field = re.search(r'field "([a-z_]+)"', str(exc))
        name = ENV_PREFIX + field.group(1).upper() if field else ENV_PREFIX + "*"
        raise ConfigError([(name, 'is not valid JSON (a table such as {"acme": {"weight": 2}})')]) from None
    except ValidationError as exc:
        raise ConfigError([(_variable_name(err["loc"], err), _rule(err)) for err in exc.errors()]) from None


def _variable_name(loc: tuple[int | str, ...], err: Any = None) -> str:
    if not loc and err is not None and "variables" in err.get("ctx", {}):
        return str(err["ctx"]["variables"])  # a check across settings names them all
    if len(loc) == 2 and loc[0] == "console" and loc[1] in CONSOLE_VARIABLES:
        return CONSOLE_VARIABLES[str(loc[1])]
    if len(loc) >= 2 and loc[0] == "webhook" and loc[1] in WEBHOOK_VARIABLES:
        return WEBHOOK_VARIABLES[str(loc[1])]
    return ENV_PREFIX + "__".join(str(part) for part in loc).upper()


def _rule(err: Any) -> str:
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "is not a fairpost setting (check the spelling)"
    return message


def mask_url(url: str) -> str:
    """``redis://user:secret@host`` → ``redis://user:***@host``; also ``?password=secret``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        # Keep the host part verbatim (an IPv6 host keeps its brackets).
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = userinfo.split(":", 1)[0] + ":***@" + hostport
    # redis-py also takes the password as a query argument.
    query = "&".join(
        item.split("=", 1)[0] + "=***" if item.split("=", 1)[0].lower() == "password" else item
        for item in parts.query.split("&")
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
