"""fairpost's settings: one model, read from ``FAIRPOST_*`` and a TOML file."""

from fairpost.config.errors import ConfigError, FairpostError
from fairpost.config.limits import Limits, Window, format_limits, parse_limits
from fairpost.config.sections import DispatcherSettings, SenderSettings, TenantSettings
from fairpost.config.settings import Settings, load_settings, mask_url
from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id

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
