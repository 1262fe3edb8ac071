"""Redis answers as Python text: a client without ``decode_responses`` gives
bytes, one with it gives str; fairpost's code reads either."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["record", "text"]


def text(value: Any) -> str:
    """A reply as text: bytes decoded as UTF-8, anything else (str, int) as ``str()``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def record(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A hash (``HGETALL``) as text; empty when the key does not exist."""
    return {text(k): text(v) for k, v in raw.items()}
