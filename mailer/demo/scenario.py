"""Demo scenarios: who sends how much, under which quotas (format: see :mod:`fairpost.mailer.demo`)."""

from __future__ import annotations

import math
import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fairpost.config import Limits, Window, is_valid_tenant_id
from fairpost.config.tenant_id import TENANT_ID_RULE
from fairpost.config.warmup import WarmupPlanSetting
from fairpost.mailer.errors import DemoError

__all__ = ["Scenario", "TenantLoad", "builtin_names", "load_scenario"]

WEBHOOK_RETRIES = "500ms,1s,2s,4s"


class TenantLoad(BaseModel):
    """One tenant's load and its quota overrides."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(default=0.0, ge=0, le=1000)
    """Mails per second, evenly spaced, for the whole load phase."""
    burst: int = Field(default=0, ge=0, le=100_000)
    """Mails enqueued at once, ``burst_at`` seconds into the load phase."""
    burst_at: float = Field(default=0.0, ge=0)
    recipients: int = Field(default=1, ge=1, le=50)
    """Recipients of each mail: what the quotas count."""
    limits: Limits | None = None
    weight: int | None = Field(default=None, ge=1, le=1000)
    inflight_cap: int | None = Field(default=None, ge=1, le=10_000)
    bounce: float = Field(default=0.0, ge=0, le=1)
    """Share of its mails addressed to SES's mailbox simulator's bounce address (each a
    different one): SES reports a permanent bounce for each, and fairpost's reputation
    guard judges the tenant by them."""
    webhook: bool = False
    """Register a webhook endpoint for the tenant at the demo's local receiver, which
    verifies each delivery and reports what arrived; its mail that does not bounce goes to
    the mailbox simulator's ``success`` address, so SES reports each delivery too."""


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    description: str = ""
    duration: float = Field(default=30.0, gt=0, le=3600)
    """Seconds of load."""
    drain: float = Field(default=10.0, ge=0, le=3600)
    """At most this many seconds after the load for the mail still waiting to be sent."""
    global_limits: Limits
    tenant_limits: Limits
    inflight_cap: int = Field(default=8, ge=1, le=10_000)
    tenants: dict[str, TenantLoad]
    reputation: dict[str, Any] = Field(default_factory=dict)
    """The reputation guard's settings (``FAIRPOST_REPUTATION__*``), e.g. ``bounce_threshold``."""
    warmup_plan: WarmupPlanSetting = None
    """The warm-up plan every tenant (all new to the demo's Redis) starts (``FAIRPOST_WARMUP__PLAN``)."""

    @field_validator("tenants")
    @classmethod
    def _tenant_ids(cls, value: dict[str, TenantLoad]) -> dict[str, TenantLoad]:
        if not value:
            raise ValueError("a scenario needs at least one tenant")
        for tenant_id in value:
            if not is_valid_tenant_id(tenant_id):
                raise ValueError(f"tenant id {tenant_id!r} must be {TENANT_ID_RULE}")
        return value

    def limits_for(self, tenant: str) -> tuple[Window, ...]:
        return self.tenants[tenant].limits or self.tenant_limits

    def planned(self, tenant: str) -> int:
        """How many mails the tenant enqueues over the whole load phase."""
        load = self.tenants[tenant]
        burst = load.burst if load.burst_at <= self.duration else 0
        return burst + math.floor(load.rate * self.duration + 1e-9)

    def total_planned(self) -> int:
        return sum(self.planned(t) for t in self.tenants)

    def bounces(self) -> bool:
        """Whether any tenant's list bounces (the demo then publishes SES events)."""
        return any(load.bounce > 0 for load in self.tenants.values())

    def webhook_tenants(self) -> list[str]:
        return [tenant for tenant, load in self.tenants.items() if load.webhook]

    def ses_events(self) -> bool:
        """Whether SES's events matter (bounces, or deliveries a webhook reports)."""
        return self.bounces() or bool(self.webhook_tenants())

    def with_duration(self, duration: float | None) -> Scenario:
        return self if duration is None else self.model_copy(update={"duration": duration})

    def config(self) -> dict[str, Any]:
        """The daemon settings this scenario implies (a fairpost TOML config's content)."""
        tenants: dict[str, Any] = {}
        for tenant, load in self.tenants.items():
            entry: dict[str, Any] = {}
            if load.limits:
                entry["limits"] = _limits_text(load.limits)
            if load.weight:
                entry["weight"] = load.weight
            if load.inflight_cap:
                entry["inflight_cap"] = load.inflight_cap
            tenants[tenant] = entry
        config: dict[str, Any] = {
            "global_limits": _limits_text(self.global_limits),
            "tenant_limits": _limits_text(self.tenant_limits),
            "inflight_cap": self.inflight_cap,
            "tenants": tenants,
        }
        if self.reputation:
            config["reputation"] = dict(self.reputation)
        if self.warmup_plan is not None:
            config["warmup"] = {"plan": str(self.warmup_plan)}
        if self.webhook_tenants():
            # The receiver is a plain http:// server on loopback; a delivery it missed
            # is tried again within the demo's drain, not five seconds later.
            config["webhook"] = {"allow_private": True, "retry_schedule": WEBHOOK_RETRIES}
        return config


def _limits_text(windows: tuple[Window, ...]) -> str:
    return "; ".join(str(w) for w in windows)


def builtin_names() -> list[str]:
    return sorted(
        entry.name.removesuffix(".toml") for entry in _scenarios().iterdir() if entry.name.endswith(".toml")
    )


def _scenarios() -> Traversable:
    """The built-in scenario files, shipped beside this module."""
    return resources.files("fairpost.mailer.demo").joinpath("scenarios")


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a TOML file by path."""
    if name_or_path in builtin_names():
        text = _scenarios().joinpath(name_or_path + ".toml").read_text(encoding="utf-8")
        return parse_scenario(text, name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise DemoError(
            f"no scenario {name_or_path!r}: give a built-in name ({', '.join(builtin_names())}) "
            "or the path of a TOML file"
        )
    return parse_scenario(path.read_text(encoding="utf-8"), path.stem, origin=str(path))


def parse_scenario(text: str, name: str, *, origin: str | None = None) -> Scenario:
    where = origin or f"scenario {name!r}"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DemoError(f"{where} is not valid TOML: {exc}") from None
    data.setdefault("name", name)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {str(err['msg']).removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise DemoError(f"{where} is not a valid scenario: {problems}") from None
