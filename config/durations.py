"""Durations written as people write them: ``"5s"``, ``"30m"``, ``"24h"``, ``"5d"``, ``"250ms"``.

A bare number is seconds. A schedule is durations separated by commas
(``"5s,5m,30m,2h"``): the webhook retry schedule (docs/outcomes.md).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer
from pydantic_settings import NoDecode

__all__ = ["Duration", "Schedule", "format_duration", "parse_duration", "parse_schedule"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_ITEM = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d)?\s*$", re.IGNORECASE)
MAX_SECONDS = 366 * 86400.0
"""A year: anything longer is a typo."""


def parse_duration(text: str) -> float:
    """Seconds in ``text``; :class:`ValueError` naming the rule when it is not a duration."""
    match = _ITEM.match(text)
    if match is None or len(text) > 40:
        raise ValueError(
            f"{text.strip()[:40]!r} is not a duration: a number and a unit, one of ms, s, m, h, d "
            '(e.g. "5s", "30m", "24h")'
        )
    seconds = float(match["number"]) * _UNITS[(match["unit"] or "s").lower()]
    if not math.isfinite(seconds) or seconds > MAX_SECONDS:
        raise ValueError(f"{text.strip()!r}: a duration may be at most 366 days")
    return seconds


def parse_schedule(text: str) -> tuple[float, ...]:
    """``"5s,5m,30m"`` → ``(5.0, 300.0, 1800.0)``: at least one step, each above zero."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError('expected at least one duration, such as "5s,5m,30m"')
    if len(parts) > 100:
        raise ValueError("at most 100 steps")
    steps = tuple(parse_duration(p) for p in parts)
    if any(step <= 0 for step in steps):
        raise ValueError("every step must be longer than zero")
    return steps


def format_duration(seconds: float) -> str:
    """The shortest exact way to write ``seconds`` (``"24h"``, ``"90s"``, ``"250ms"``)."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    millis = seconds * 1000
    return f"{int(millis)}ms" if millis.is_integer() else f"{seconds}s"


def _duration(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str) else value


def _schedule(value: Any) -> Any:
    if isinstance(value, str):
        return parse_schedule(value)
    if isinstance(value, (list, tuple)):
        return tuple(parse_duration(v) if isinstance(v, str) else v for v in value)
    return value


Duration = Annotated[float, BeforeValidator(_duration), PlainSerializer(format_duration, return_type=str)]
"""A pydantic field type: written ``"24h"`` (or seconds), held as seconds."""

Schedule = Annotated[
    tuple[float, ...],
    NoDecode,
    BeforeValidator(_schedule),
    PlainSerializer(lambda steps: ",".join(format_duration(s) for s in steps), return_type=str),
]
"""A pydantic field type: written ``"5s,5m,30m"``, held as seconds."""
