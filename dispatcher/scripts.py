"""Lua scripts, loaded from the ``.lua`` files beside the modules that use them."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def lua_source(package: str, name: str) -> str:
    """The text of ``<package>/<name>.lua``, read once per process."""
    return (files(package) / f"{name}.lua").read_text(encoding="utf-8")
