"""fairpost's settings: one model, read from ``FAIRPOST_*`` and a TOML file."""

from config.errors import ConfigError, FairpostError
from config.limits import Limits, Window, format_limits, parse_limits
from config.settings import (
    DispatcherSettings,
    SenderSettings,
    Settings,
    TenantSettings,
    load_settings,
    mask_url,
)
from config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id

__all__ = [
    "TENANT_ID_RULE",
    "ConfigError",
    "DispatcherSettings",
    "FairpostError",
    "Limits",
    "SenderSettings",
    "Settings",
    "TenantSettings",
    "Window",
    "format_limits",
    "is_valid_tenant_id",
    "load_settings",
    "mask_url",
    "parse_limits",
]
