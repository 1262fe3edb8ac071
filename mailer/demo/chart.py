"""The demo's chart and the data behind it: each tenant's send rate against its
quota, all tenants against the global quota, each mail's latency, and a bouncing
tenant's bounce rate against the reputation guard (drawn with matplotlib, the
``demo`` extra); and every job as CSV.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairpost.mailer.demo.monitor import JobBook
from fairpost.mailer.demo.scenario import Scenario

if TYPE_CHECKING:
    from fairpost.mailer.demo.report import Report

__all__ = ["ReputationTrace", "rate_series", "write_chart", "write_jobs_csv"]

_SMOOTH_SECONDS = 4.0
_STEP_SECONDS = 0.25


def rate_series(events: Sequence[tuple[float, int]], end: float) -> tuple[list[float], list[float]]:
    """Recipients per second, averaged over a window ``(x - 2 s, x + 2 s]`` around each
    sample ``x``, for the samples whose whole window lies within ``[0, end]``.

    An average over whole windows never shows a tenant that kept its
    per-second quota above it.
    """
    xs: list[float] = []
    ys: list[float] = []
    ordered = sorted(events)
    lo = hi = 0
    total = 0
    half = _SMOOTH_SECONDS / 2
    for i in range(int((end - 2 * half) / _STEP_SECONDS) + 1):
        x = half + i * _STEP_SECONDS
        while hi < len(ordered) and ordered[hi][0] <= x + half:
            total += ordered[hi][1]
            hi += 1
        while lo < hi and ordered[lo][0] <= x - half:
            total -= ordered[lo][1]
            lo += 1
        xs.append(x)
        ys.append(total / _SMOOTH_SECONDS)
    return xs, ys


def write_jobs_csv(book: JobBook, origin_ms: int, path: Path) -> None:
    """Every job: the data behind the chart, for anyone who wants to look again."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["job_id", "tenant", "recipients", "state", "enqueued_s", "sent_s"])
        for job_id, job in book.jobs.items():
            out.writerow(
                [
                    job_id,
                    job.tenant,
                    job.recipients,
                    job.state,
                    "" if job.created_ms is None else (job.created_ms - origin_ms) / 1000,
                    "" if job.sent_ms is None else (job.sent_ms - origin_ms) / 1000,
                ]
            )


def _colors(scenario: Scenario) -> dict[str, str]:
    """Red for a lone bursting tenant, distinct colours for everyone else."""
    import matplotlib

    tenants = list(scenario.tenants)
    bursty = [t for t in tenants if scenario.tenants[t].burst]
    table = "tab10" if len(tenants) <= 9 else "tab20"
    cmap = matplotlib.colormaps[table]
    palette = [
        matplotlib.colors.to_hex(cmap(i))
        for i in range(cmap.N)
        if table != "tab10" or i != 3  # tab10's red is kept for the noisy tenant
    ]
    colors: dict[str, str] = {}
    for tenant in tenants:
        if bursty == [tenant]:
            colors[tenant] = "#d62728"
        else:
            colors[tenant] = palette[len(colors) % len(palette)]
    return colors


def _label(scenario: Scenario, tenant: str, report: Report | None) -> str:
    load = scenario.tenants[tenant]
    parts = []
    if load.burst:
        parts.append(f"burst of {load.burst:,}")
    if load.rate:
        parts.append(f"{load.rate:g} mail{'' if load.rate == 1 else 's'}/s")
    if load.recipients > 1:
        parts.append(f"{load.recipients} recipients each")
    label = f"{tenant} ({', '.join(parts)})" if parts else tenant
    numbers = report.tenants.get(tenant) if report else None
    if numbers and numbers.windows and numbers.latency_p99_seconds is not None:
        peak = numbers.windows[0]
        label += f"\n    peak {peak.highest}/{peak.allowed} per {peak.limit.split('/', 1)[1]}"
        label += f", p99 latency {numbers.latency_p99_seconds:.2f}s"
    return label


@dataclass
class ReputationTrace:
    """Bouncing tenants' bounce rates over the run, as the reputation guard counts them
    (bounces / max(sends, min_sends) over 24 h), and when the guard acted."""

    threshold: float
    throttle_at: float
    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    acted: dict[str, list[tuple[float, str]]] = field(default_factory=dict)

    def add(self, elapsed: float, tenant: str, rate: float, level: str | None) -> None:
        self.points.setdefault(tenant, []).append((elapsed, rate))
        seen = self.acted.setdefault(tenant, [])
        if level is not None and (not seen or seen[-1][1] != level):
            seen.append((elapsed, level))


def write_chart(
    scenario: Scenario,
    book: JobBook,
    origin_ms: int,
    end_seconds: float,
    path: Path,
    report: Report | None = None,
    reputation: ReputationTrace | None = None,
) -> None:
    """Each tenant's send rate over time with its quota, everyone stacked against the
    global quota, and each mail's enqueue→SES latency: the picture of isolation; with a
    bouncing tenant, its bounce rate against the guard's threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = _colors(scenario)
    rates: dict[str, tuple[list[float], list[float]]] = {}
    for tenant in scenario.tenants:
        events = [
            ((j.sent_ms - origin_ms) / 1000, j.recipients) for j in book.sent(tenant) if j.sent_ms is not None
        ]
        rates[tenant] = rate_series(events, end_seconds)

    bouncing = reputation is not None and bool(reputation.points)
    ratios = [3, 1.4, 1.6] + ([1.6] if bouncing else [])
    fig, axes = plt.subplots(
        len(ratios), 1, figsize=(13, 9 + (2.5 if bouncing else 0)), sharex=True,
        gridspec_kw={"height_ratios": ratios},
    )  # fmt: skip
    title = f"fairpost demo: {scenario.name}"
    if scenario.description:
        title += f": {scenario.description}"
    fig.suptitle(title, fontsize=12)

    _rate_panel(axes[:3], scenario, rates, colors, report)
    _total_panel(axes[1], scenario, rates, colors)
    _latency_panel(axes[2], scenario, book, origin_ms, colors)
    if bouncing and reputation is not None:
        axes[2].set_xlabel("")
        _bounce_panel(axes[3], reputation, colors)

    for ax in axes:
        ax.axvspan(scenario.duration, max(end_seconds, scenario.duration), color="0.92", zorder=0)
        ax.grid(alpha=0.3)
        ax.set_xlim(0, end_seconds)
    axes[2].annotate(
        "drain",
        (scenario.duration, 0.03),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0),
        textcoords="offset points",
        fontsize=8,
        color="0.35",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _rate_panel(
    axes: Sequence[Any],
    scenario: Scenario,
    rates: dict[str, tuple[list[float], list[float]]],
    colors: dict[str, str],
    report: Report | None,
) -> None:
    """Per-tenant send rate, with each distinct tenant quota drawn, and a lone burst
    marked on the first three panels (``axes``: rate, total, latency)."""
    ax_rate = axes[0]
    tenants = list(scenario.tenants)
    lone = [t for t in tenants if scenario.tenants[t].burst]
    for tenant in tenants:
        xs, ys = rates[tenant]
        heavy = len(lone) == 1 and tenant in lone
        label = _label(scenario, tenant, report)
        ax_rate.plot(xs, ys, color=colors[tenant], linewidth=2.6 if heavy else 1.4, label=label)
    quotas = sorted({scenario.limits_for(t)[0] for t in tenants}, key=lambda w: w.limit / w.seconds)
    for window in quotas:
        _quota_line(ax_rate, window.limit / window.seconds, f"tenant quota {window}", 3)
    top = max(w.limit / w.seconds for w in quotas)
    ax_rate.set_ylim(0, top * 1.3)
    ax_rate.set_ylabel(f"recipients/s\n({_SMOOTH_SECONDS:g}-s average)")
    ax_rate.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False, labelspacing=0.8)
    ax_rate.set_title("send rate per tenant", fontsize=10, loc="left")
    for tenant in lone:
        load = scenario.tenants[tenant]
        for ax in axes:
            ax.axvline(load.burst_at, color=colors[tenant], linestyle=":", linewidth=1.2)
        ax_rate.annotate(
            f"{tenant} enqueues {load.burst:,} mails at once",
            (load.burst_at, top * 1.22),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=9,
            color=colors[tenant],
        )


def _total_panel(
    ax: Any, scenario: Scenario, rates: dict[str, tuple[list[float], list[float]]], colors: dict[str, str]
) -> None:
    """All tenants together, stacked, against the global quota."""
    tenants = list(scenario.tenants)
    xs = rates[tenants[0]][0]
    ax.stackplot(xs, *(rates[t][1] for t in tenants), colors=[colors[t] for t in tenants], alpha=0.85)
    global_window = scenario.global_limits[0]
    global_rate = global_window.limit / global_window.seconds
    _quota_line(ax, global_rate, f"global quota {global_window}", -11)
    ax.set_ylim(0, global_rate * 1.15)
    ax.set_ylabel("recipients/s")
    ax.set_title("all tenants, stacked", fontsize=10, loc="left")


def _latency_panel(
    ax: Any, scenario: Scenario, book: JobBook, origin_ms: int, colors: dict[str, str]
) -> None:
    """Latency from enqueue to SES, per mail."""
    for tenant in scenario.tenants:
        points = [
            ((j.sent_ms - origin_ms) / 1000, (j.sent_ms - j.created_ms) / 1000)
            for j in book.sent(tenant)
            if j.sent_ms is not None and j.created_ms is not None
        ]
        if points:
            xs_lat, ys_lat = [p[0] for p in points], [max(p[1], 0.01) for p in points]
            ax.scatter(xs_lat, ys_lat, s=5, color=colors[tenant])
    ax.set_yscale("log")
    ax.set_ylabel("enqueue → SES (s)")
    ax.set_title("latency of each mail", fontsize=10, loc="left")
    ax.set_xlabel("seconds since the load started")


def _quota_line(ax: Any, per_second: float, text: str, offset: int) -> None:
    """A quota as a dashed line, named at the left edge ``offset`` points above it."""
    ax.axhline(per_second, color="black", linestyle="--", linewidth=1)
    ax.annotate(
        text,
        (0.005, per_second),
        xycoords=("axes fraction", "data"),
        xytext=(0, offset),
        textcoords="offset points",
        fontsize=9,
    )


def _bounce_panel(ax: Any, trace: ReputationTrace, colors: dict[str, str]) -> None:
    """The bouncing tenants' bounce rate against the threshold, with the guard's actions."""
    top = trace.threshold * 1.6
    for tenant, points in trace.points.items():
        ax.plot([p[0] for p in points], [p[1] * 100 for p in points], color=colors[tenant], linewidth=2)
        top = max(top, max(p[1] for p in points) * 1.2)
        for at, level in trace.acted.get(tenant, []):
            color = "red" if level == "paused" else "darkorange"
            ax.axvline(at, color=color, linewidth=1.2)
            ax.annotate(
                f"{tenant} {level}", (at, top * 100 * 0.9), xytext=(4, 0), textcoords="offset points",
                fontsize=9, color=color,
            )  # fmt: skip
    for line, style in ((trace.threshold, "--"), (trace.threshold * trace.throttle_at, ":")):
        ax.axhline(line * 100, color="black", linestyle=style, linewidth=1)
    ax.annotate(
        f"pause at {trace.threshold:.0%}, throttle at {trace.threshold * trace.throttle_at:.0%}",
        (0.005, trace.threshold * 100), xycoords=("axes fraction", "data"), xytext=(0, 3),
        textcoords="offset points", fontsize=9,
    )  # fmt: skip
    ax.set_ylim(0, top * 100)
    ax.set_ylabel("bounce rate %\n(over ≥ 200 sends)")
    ax.set_title("bounce rate as the reputation guard counts it", fontsize=10, loc="left")
    ax.set_xlabel("seconds since the load started")
