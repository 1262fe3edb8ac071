"""Where settings come from besides ``FAIRPOST_<FIELD>`` variables: the TOML file named
by ``FAIRPOST_CONFIG_FILE``, and the console's and webhooks' flat variables
(``FAIRPOST_CONSOLE_PORT``...), as pydantic-settings sources."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from fairpost.config.errors import ConfigError
from fairpost.config.sections import CONSOLE_VARIABLES, WEBHOOK_VARIABLES

__all__ = ["CONFIG_FILE_VAR", "ConsoleEnvSource", "TomlFileSource", "read_toml"]

CONFIG_FILE_VAR = "FAIRPOST_CONFIG_FILE"


class TomlFileSource(PydanticBaseSettingsSource):
    """Reads the TOML file named by ``FAIRPOST_CONFIG_FILE`` (or ``config_file``)."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        path = os.environ.get(CONFIG_FILE_VAR)
        self._data: dict[str, Any] = read_toml(Path(path)) if path else {}

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class ConsoleEnvSource(PydanticBaseSettingsSource):
    """The console and webhook sections from :data:`CONSOLE_VARIABLES` (``FAIRPOST_CONSOLE_PORT``...)
    and :data:`WEBHOOK_VARIABLES` (``FAIRPOST_WEBHOOK_RETRY_SCHEDULE``...)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for section, variables in (("console", CONSOLE_VARIABLES), ("webhook", WEBHOOK_VARIABLES)):
            values = {name: os.environ[var] for name, var in variables.items() if var in os.environ}
            if values:
                out[section] = values
        return out


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError([(CONFIG_FILE_VAR, f"file {str(path)!r} does not exist")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([(CONFIG_FILE_VAR, f"{str(path)!r} is not valid TOML: {exc}")]) from None
    # The file may wrap everything in a [fairpost] table, or not.
    inner = data.get("fairpost", data)
    if not isinstance(inner, dict):
        raise ConfigError([(CONFIG_FILE_VAR, "[fairpost] must be a table")])
    return inner
