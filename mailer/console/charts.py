"""The console's charts, as SVG coordinates computed on the server (no script, no CDN):
the templates draw them inline (``_minute_chart.html``, ``_deliverability.html``).
Nothing here does I/O; every bar carries its value in ``data-*`` attributes and a
``<title>``, so that a reader, a screen reader and the browser tests read the same
numbers the chart is drawn from.

- :func:`minute_chart`: recipients sent in each of the last 60 minutes (the send
  history, mailer/sdk/rollups.py) against a limit per minute;
- :func:`day_bars`: a provider's 14 days, recipients sent with the bounced part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from fairpost.mailer.ops.stats import WindowUsage
from fairpost.mailer.sdk.rollups import ProviderCounts, SendHistory

__all__ = ["Bar", "DayBar", "Limit", "MinuteChart", "day_bars", "minute_chart", "minute_limit"]

WIDTH = 600
HEIGHT = 140
DAY_WIDTH = 140
DAY_HEIGHT = 32


@dataclass(frozen=True)
class Limit:
    per_minute: float
    window: WindowUsage
    """The window it comes from."""

    @property
    def text(self) -> str:
        return f"{self.per_minute:,.0f}/min (from {self.window.limit:,}/{self.window.name})"


def minute_limit(windows: Sequence[WindowUsage]) -> Limit | None:
    """The quota's cap on one minute: the tightest window of a minute or less, scaled to
    a minute (10/second: 600/min); with only longer windows, the shortest one's
    average over a minute (5000/hour: 83/min), which a burst may pass."""
    if not windows:
        return None
    short = [w for w in windows if w.seconds <= 60] or [min(windows, key=lambda w: w.seconds)]
    best = min(short, key=lambda w: w.limit * 60 / w.seconds)
    return Limit(best.limit * 60 / best.seconds, best)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    """``HH:MM`` (UTC) of the minute."""
    value: int


@dataclass(frozen=True)
class MinuteChart:
    bars: list[Bar]
    limit: Limit | None
    limit_y: float | None
    top: float
    total: int
    over: int
    """Minutes whose sends passed the limit line."""
    width: int = WIDTH
    height: int = HEIGHT


def minute_chart(history: SendHistory, limit: Limit | None) -> MinuteChart:
    """Bars of the last 60 minutes; the scale's top leaves room for the limit line."""
    values = [c for _, c in history.minutes]
    top = max([1.0, *values, *([limit.per_minute * 1.1] if limit else [])])
    step = WIDTH / max(1, len(values))
    usable = HEIGHT - 14  # room for the labels at the top
    bars = [
        Bar(
            x=round(i * step + 0.5, 1),
            y=round(HEIGHT - v / top * usable, 1),
            width=round(max(1.0, step - 1.5), 1),
            height=round(v / top * usable, 1),
            label=datetime.fromtimestamp(at_ms / 1000, tz=UTC).strftime("%H:%M"),
            value=v,
        )
        for i, (at_ms, v) in enumerate(history.minutes)
    ]
    limit_y = round(HEIGHT - limit.per_minute / top * usable, 1) if limit else None
    over = sum(1 for v in values if limit and v > limit.per_minute)
    return MinuteChart(bars, limit, limit_y, top, sum(values), over)


@dataclass(frozen=True)
class DayBar:
    x: float
    day: str
    sent: int
    bounced: int
    """Hard and soft."""
    sent_y: float
    bounced_y: float
    width: float


def day_bars(days: Sequence[str], series: Sequence[ProviderCounts]) -> list[DayBar]:
    """One bar a day: its height the recipients sent (scaled to the busiest day), its
    red foot those that bounced."""
    top = max([1, *(p.counts["sent"] for p in series)])
    step = DAY_WIDTH / max(1, len(days))
    bars = []
    for i, (day, p) in enumerate(zip(days, series, strict=True)):
        sent, bounced = p.counts["sent"], p.counts["hard_bounced"] + p.counts["soft_bounced"]
        bars.append(
            DayBar(
                x=round(i * step + 0.5, 1),
                day=day,
                sent=sent,
                bounced=bounced,
                sent_y=round(DAY_HEIGHT - min(sent, top) / top * DAY_HEIGHT, 1),
                bounced_y=round(DAY_HEIGHT - min(bounced, top) / top * DAY_HEIGHT, 1),
                width=round(max(1.0, step - 1.5), 1),
            )
        )
    return bars
