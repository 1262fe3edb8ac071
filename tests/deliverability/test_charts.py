"""The console's charts as numbers (mailer/console/charts.py): no browser, no Redis.
tests/console/test_console_charts.py reads the same numbers off the page."""

from __future__ import annotations

from fairpost.mailer.console.charts import day_bars, minute_chart, minute_limit
from fairpost.mailer.ops.stats import WindowUsage
from fairpost.mailer.sdk.rollups import COUNTERS, ProviderCounts, SendHistory


def test_the_limit_per_minute_is_the_tightest_window_of_a_minute_or_less() -> None:
    limit = minute_limit([WindowUsage(1, 10, 0), WindowUsage(60, 500, 0), WindowUsage(86400, 50_000, 0)])
    assert limit is not None and limit.per_minute == 500 and limit.text == "500/min (from 500/minute)"
    only_long = minute_limit([WindowUsage(3600, 6000, 0), WindowUsage(86400, 50_000, 0)])
    assert only_long is not None and only_long.per_minute == 100  # an hour's average: a burst may pass it
    assert minute_limit([]) is None


def test_bars_carry_their_minutes_and_values_and_count_the_minutes_over_the_limit() -> None:
    minutes = [(m * 60_000, n) for m, n in enumerate([0] * 57 + [3, 12, 5])]
    chart = minute_chart(SendHistory(minutes, 60 * 60_000), minute_limit([WindowUsage(60, 10, 0)]))
    assert [b.value for b in chart.bars[-3:]] == [3, 12, 5] and chart.total == 20 and chart.over == 1
    assert chart.bars[-1].label == "00:59" and len(chart.bars) == 60
    tallest = max(chart.bars, key=lambda b: b.height)
    assert tallest.value == 12 and tallest.y >= 14  # the top leaves room for the labels
    assert chart.limit_y is not None and chart.limit_y > tallest.y  # 12 is over the line at 10


def test_a_days_bar_is_its_sent_with_its_bounced_part() -> None:
    def day(sent: int, hard: int, soft: int) -> ProviderCounts:
        return ProviderCounts(
            "gmail", {**dict.fromkeys(COUNTERS, 0), "sent": sent, "hard_bounced": hard, "soft_bounced": soft}
        )

    bars = day_bars(["2030-01-01", "2030-01-02"], [day(10, 2, 1), day(0, 0, 0)])
    assert [(b.day, b.sent, b.bounced) for b in bars] == [("2030-01-01", 10, 3), ("2030-01-02", 0, 0)]
    assert bars[0].sent_y == 0 and bars[1].sent_y == 32 and bars[0].bounced_y > bars[0].sent_y
