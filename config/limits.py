"""Rate limits written as in the ``limits`` library and Flask-Limiter.

``"14/second; 50000/day"`` is two windows; ``"100 per 2 minutes"`` and
``"5/10 seconds"`` are accepted too. Each window is a count of units
(recipients, for mail) over a sliding interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, PlainSerializer
from pydantic_settings import NoDecode

_UNIT_SECONDS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
}
_ITEM = re.compile(
    r"^\s*(?P<count>\d+)\s*(?:/|per)\s*(?P<multiple>\d+)?\s*(?P<unit>second|minute|hour|day)s?\s*$",
    re.IGNORECASE,
)
# SQS visibility is capped at 12 h and a day window is what SES enforces:
# longer windows would only be served in many steps for no benefit.
MAX_WINDOW_SECONDS = 7 * 86400
# Far above any SES quota: a bigger count is a typo, and the quota scripts' numbers
# (doubles) stay exact well beyond it.
MAX_COUNT = 1_000_000_000


BUDGET_SECONDS = 60
"""Windows this long or longer are budgets: a mail to more recipients than the limit
can never be sent. Shorter windows are rates: such a mail goes alone once the
window is empty (as SES takes a 50-recipient mail at 14/second)."""


@dataclass(frozen=True, order=True)
class Window:
    """At most ``limit`` units in any interval of ``seconds``."""

    seconds: int
    limit: int

    @property
    def is_budget(self) -> bool:
        """A minute or longer (see :data:`BUDGET_SECONDS`)."""
        return self.seconds >= BUDGET_SECONDS

    def __str__(self) -> str:
        for unit, size in sorted(_UNIT_SECONDS.items(), key=lambda kv: -kv[1]):
            if self.seconds % size == 0:
                multiple = self.seconds // size
                return f"{self.limit}/{unit}" if multiple == 1 else f"{self.limit}/{multiple} {unit}s"
        raise AssertionError("unreachable: seconds is a whole number of seconds")


def parse_limits(text: str) -> tuple[Window, ...]:
    """Parse ``"14/second; 50000/day"`` into windows, shortest first.

    Raises :class:`ValueError` naming the part that is wrong and the rule.
    """
    parts = [p for p in re.split(r"[;,]", text) if p.strip()]
    if not parts:
        raise ValueError('expected at least one limit such as "14/second; 50000/day"')
    windows: dict[int, Window] = {}
    for part in parts:
        match = _ITEM.match(part)
        if match is None:
            raise ValueError(
                f"{part.strip()!r} is not a limit: expected COUNT/UNIT or COUNT per N UNITs, "
                'UNIT one of second, minute, hour, day (e.g. "14/second; 50000/day")'
            )
        count = _whole(match["count"])
        seconds = _whole(match["multiple"] or "1") * _UNIT_SECONDS[match["unit"].lower()]
        if count < 1:
            raise ValueError(f"{part.strip()!r}: the count must be at least 1")
        if count > MAX_COUNT:
            raise ValueError(f"{part.strip()!r}: the count may be at most {MAX_COUNT}")
        if seconds < 1:
            # "1 per 0 seconds" would never refuse anything.
            raise ValueError(f"{part.strip()!r}: a window must last at least 1 second")
        if seconds > MAX_WINDOW_SECONDS:
            raise ValueError(f"{part.strip()!r}: a window may be at most 7 days")
        if seconds in windows:
            raise ValueError(f"{part.strip()!r}: two limits for the same window")
        windows[seconds] = Window(seconds=seconds, limit=count)
    return tuple(sorted(windows.values()))


def _whole(digits: str) -> int:
    """The number, or one above every rule's bound: int() refuses thousands of digits,
    with a message that names no rule."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18


def budget_exceeded(cost: int, windows: tuple[Window, ...]) -> Window | None:
    """The first budget window whose limit ``cost`` units exceed: they never fit in it."""
    return next((w for w in windows if w.is_budget and cost > w.limit), None)


def format_limits(windows: tuple[Window, ...]) -> str:
    return "; ".join(str(w) for w in windows)


def _coerce(value: Any) -> Any:
    if isinstance(value, str):
        return parse_limits(value)
    return value


Limits = Annotated[
    tuple[Window, ...],
    NoDecode,
    BeforeValidator(_coerce),
    PlainSerializer(format_limits, return_type=str),
]
"""A pydantic field type: written as a string, held as windows."""


AUTO = "auto"
"""``FAIRPOST_GLOBAL_LIMITS=auto``: the global windows come from SES ``GetAccount``."""


def _coerce_global(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    return _coerce(value)


def _format_global(value: tuple[Window, ...] | Literal["auto"]) -> str:
    return AUTO if isinstance(value, str) else format_limits(value)


GlobalLimits = Annotated[
    tuple[Window, ...] | Literal["auto"],
    NoDecode,
    BeforeValidator(_coerce_global),
    PlainSerializer(_format_global, return_type=str),
]
"""Like :data:`Limits`, or the word ``"auto"``."""
