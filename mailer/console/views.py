"""What the pages say, none of it I/O: why a tenant waits, times, masked
addresses, the backlog's line (the bar charts: charts.py). The templates call these as
filters and globals."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from fairpost.mailer.ops.stats import ScopeStats, WindowUsage

__all__ = ["Chart", "Wait", "chart", "clock", "mask_address", "mask_text", "rate", "waits", "warmup_source"]

_ADDRESS = re.compile(r"([A-Za-z0-9._%+-])[A-Za-z0-9._%+-]*@([A-Za-z0-9.-]+\.[A-Za-z]{2,})")


def mask_address(address: str) -> str:
    """``ada@example.com`` → ``a***@example.com``: enough to tell entries apart."""
    local, at, domain = address.rpartition("@")
    if not at:
        return "***"
    return (local[:1] or "*") + "***@" + domain


def mask_text(text: str | None) -> str:
    """Free text (an SES diagnostic, a last error) with every address in it masked."""
    return _ADDRESS.sub(lambda m: f"{m.group(1)}***@{m.group(2)}", text or "")


def clock(ms: int | None) -> str:
    """A Redis time as ``2030-01-31 09:00:00 UTC``; ``-`` for none."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def rate(scope: ScopeStats) -> float:
    """Recipients per second in the scope's shortest window, as the quota engine counts them."""
    if not scope.windows:
        return 0.0
    shortest = min(scope.windows, key=lambda w: w.seconds)
    return shortest.used / shortest.seconds


def warmup_source(source: str) -> str:
    """Where a tenant's warm-up plan came from, in words."""
    if source == "default":
        return "the default plan, FAIRPOST_WARMUP__PLAN, started at its first mail"
    return "set by an operator"


def full_windows(windows: Sequence[WindowUsage]) -> list[WindowUsage]:
    return [w for w in windows if w.used >= w.limit]


@dataclass(frozen=True)
class Wait:
    """One reason a tenant does not send now."""

    kind: str
    """``paused``, ``guard``, ``provider``, ``ses``, ``hold`` or ``quota``: for the page's
    styling and tests."""
    reason: str
    until: str
    """When it ends, as far as known: a time, or what lifts it."""


def waits(scope: ScopeStats, at_ms: int) -> list[Wait]:
    """Every reason the tenant waits now, most binding first; empty if it may send."""
    found: list[Wait] = []
    if scope.paused:
        found.append(Wait("paused", "paused by an operator", "resumed"))
    if scope.guard is not None:
        level = (
            "paused"
            if scope.guard.level == "paused"
            else f"throttled to {scope.guard.override or 'a low rate'}"
        )
        found.append(Wait("guard", f"{level} by the reputation guard: {scope.guard.reason}", "resumed"))
    for provider, hold in sorted(scope.provider_holds.items()):
        found.append(
            Wait("provider", f"its mail to {provider} held by the reputation guard: {hold.reason}", "resumed")
        )
    if scope.ses_disabled is not None:
        cause = f" ({scope.ses_disabled.cause})" if scope.ses_disabled.cause else ""
        found.append(
            Wait(
                "ses",
                f"SES disabled its SES tenant {scope.ses_disabled.ses_tenant}{cause}",
                "SES enables it, or resumed",
            )
        )
    if scope.held_by is not None and (scope.held_until_ms or 0) > at_ms:
        found.append(
            Wait("hold", f"held: SES refused its own set-up ({scope.held_by})", clock(scope.held_until_ms))
        )
    if scope.retry_after < 0:
        found.append(Wait("quota", "a limit of its quota is smaller than one recipient", "the quota changes"))
    elif scope.retry_after > 0:
        full = ", ".join(f"{w.used} of {w.limit} per {w.name}" for w in full_windows(scope.windows))
        found.append(
            Wait(
                "quota",
                f"tenant quota full ({full or 'a window is full'})",
                f"{clock(at_ms + int(scope.retry_after * 1000))} (in {scope.retry_after:.1f} s)",
            )
        )
    return found


@dataclass(frozen=True)
class Chart:
    """A line of samples over time (the backlog), drawn as SVG coordinates."""

    points: str
    """``x,y x,y ...`` for a ``<polyline>``."""
    top: float
    """The value at the top of the chart."""
    latest: float | None
    width: int
    height: int


def chart(
    samples: Sequence[tuple[float, float]], now: float, span: float, width: int = 600, height: int = 120
) -> Chart:
    """``samples`` of (time, value) over the last ``span`` seconds up to ``now``."""
    shown = [(t, v) for t, v in samples if now - span <= t <= now]
    top = max([1.0, *(v for _, v in shown)])
    points = " ".join(
        f"{(t - (now - span)) / span * width:.1f},{height - v / top * (height - 4):.1f}" for t, v in shown
    )
    return Chart(points, top, shown[-1][1] if shown else None, width, height)
