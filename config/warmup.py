"""Warm-up plans: a new tenant's limits grow on a schedule.

A plan is steps separated by ``|``, each ``LIMITS from OFFSET``: LIMITS in the
notation of :mod:`fairpost.config.limits`, OFFSET how long after the tenant's
warm-up started the step begins::

    50/hour; 500/day from 0s | 200/hour; 2000/day from 1 day | 1000/hour from 3 days

The first step starts at ``0s`` and offsets increase. The last step holds
until an operator ends the warm-up, unless it is ``none from OFFSET``, which
ends it by itself then. While a tenant warms up, its limits are the stricter
of its step's and its own, window by window (:func:`stricter`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer
from pydantic_settings import NoDecode

from fairpost.config.limits import Limits, Window, format_limits, parse_limits

__all__ = ["WarmupPlan", "WarmupPlanSetting", "WarmupStep", "format_offset", "parse_plan", "stricter"]

_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400),
}
_UNIT_NAMES = "s, m, h, d, w (or second, minute, hour, day, week)"
_OFFSET = re.compile(r"^(?P<count>\d+)\s*(?P<unit>[A-Za-z]+)$")
_FROM = re.compile(r"\s+from\s+", re.IGNORECASE)
_EXAMPLE = '"50/hour; 500/day from 0s | 200/hour from 1 day | none from 7 days"'

MAX_OFFSET_SECONDS = 365 * 86400
"""A step later than a year is a typo, not a warm-up."""

NONE = "none"
"""The LIMITS of a last step that ends the warm-up."""


@dataclass(frozen=True)
class WarmupStep:
    """From ``offset`` seconds after the warm-up started: ``limits``, or the end (``None``)."""

    offset: int
    limits: Limits | None

    def __str__(self) -> str:
        limits = NONE if self.limits is None else format_limits(self.limits)
        return f"{limits} from {format_offset(self.offset)}"


@dataclass(frozen=True)
class WarmupPlan:
    """The steps, in order: the first at offset 0, offsets increasing."""

    steps: tuple[WarmupStep, ...]

    def __str__(self) -> str:
        return " | ".join(str(step) for step in self.steps)


def parse_plan(text: str) -> WarmupPlan:
    """Parse a plan; :class:`ValueError` names the step (1-based) and the rule it breaks."""
    parts = text.split("|")
    if not text.strip():
        raise ValueError(f"expected at least one step such as {_EXAMPLE}")
    steps: list[WarmupStep] = []
    for number, part in enumerate(parts, start=1):
        where = f"step {number} ({part.strip()!r})"
        pieces = _FROM.split(part.strip())
        if len(pieces) != 2 or not pieces[0] or not pieces[1]:
            raise ValueError(f"{where}: expected LIMITS from OFFSET, e.g. {_EXAMPLE}")
        limits_text, offset_text = pieces
        offset = _offset(offset_text, where)
        limits = None
        if limits_text.strip().lower() != NONE:
            try:
                limits = parse_limits(limits_text)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        if number == 1 and offset != 0:
            raise ValueError(f"{where}: the first step starts at 0s, not {format_offset(offset)}")
        if steps and offset <= steps[-1].offset:
            raise ValueError(
                f"{where}: offsets must increase, and {format_offset(offset)} is not after "
                f"step {number - 1}'s {format_offset(steps[-1].offset)}"
            )
        if limits is None and number == 1:
            raise ValueError(f"{where}: the first step cannot be none (an empty plan means no warm-up)")
        if steps and steps[-1].limits is None:
            raise ValueError(f"step {number - 1}: none ends the warm-up, so it must be the last step")
        steps.append(WarmupStep(offset, limits))
    return WarmupPlan(tuple(steps))


def _offset(text: str, where: str) -> int:
    match = _OFFSET.match(text.strip())
    if match is None:
        raise ValueError(
            f"{where}: {text.strip()!r} is not an offset: expected a whole number and a unit "
            f"such as 0s, 15s, 1 day, 3 days"
        )
    unit = match["unit"].lower()
    if unit not in _UNITS:
        raise ValueError(f"{where}: unknown unit {match['unit']!r} in the offset: use {_UNIT_NAMES}")
    digits = match["count"].lstrip("0") or "0"
    if len(digits) > 12 or int(digits) * _UNITS[unit] > MAX_OFFSET_SECONDS:
        raise ValueError(f"{where}: an offset may be at most 365 days")
    return int(digits) * _UNITS[unit]


def format_offset(seconds: int) -> str:
    """``0s``, ``15s``, ``2 minutes``, ``1 day``, ``3 days``: the largest unit that divides it."""
    if seconds == 0:
        return "0s"
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {name}" + ("s" if count > 1 else "")
    return f"{seconds}s"


def stricter(own: Limits, step: Limits) -> Limits:
    """Every window of either, the lower limit where both have a window of one length."""
    merged = {w.seconds: w.limit for w in own}
    for w in step:
        merged[w.seconds] = min(w.limit, merged.get(w.seconds, w.limit))
    return tuple(sorted(Window(seconds, limit) for seconds, limit in merged.items()))


def _coerce(value: Any) -> Any:
    if isinstance(value, str):
        return parse_plan(value) if value.strip() else None
    return value


def _format(value: WarmupPlan | None) -> str:
    return "" if value is None else str(value)


WarmupPlanSetting = Annotated[
    WarmupPlan | None,
    NoDecode,
    BeforeValidator(_coerce),
    PlainSerializer(_format, return_type=str),
]
"""A pydantic field type: written as plan text (empty: no plan), held as a :class:`WarmupPlan`."""
