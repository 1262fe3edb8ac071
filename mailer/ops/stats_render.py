"""``fairpost stats`` shown: a text table, or a live ``rich`` one (``--watch``), of
what :func:`fairpost.mailer.ops.stats.collect_stats` read."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fairpost.mailer.ops.stats import ScopeStats, Stats, WindowUsage

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["render_table", "render_text"]


def _usage(windows: Sequence[WindowUsage]) -> str:
    return ", ".join(f"{w.used}/{w.limit} per {w.name}" for w in windows) or "-"


def _state(scope: ScopeStats) -> str:
    if scope.ses_disabled is not None:
        return "parked: SES disabled its SES tenant"
    if scope.guard is not None and scope.guard.level == "paused":
        return "paused by the reputation guard"
    if scope.paused:
        return "paused"
    if scope.held_by:
        return f"held ({scope.held_by})"
    if scope.retry_after < 0:
        return "blocked (limit too small)"
    if scope.retry_after > 0:
        return f"throttled {scope.retry_after:.1f}s"
    if scope.guard is not None:
        return "throttled by the reputation guard"
    if scope.provider_holds:
        return "held at " + ", ".join(sorted(scope.provider_holds))
    return "ok"


def _rates(scope: ScopeStats) -> str:
    if scope.reputation is None:
        return "-"
    return (
        ", ".join(
            f"{w.bounce_rate:.1%} / {w.complaint_rate:.2%} ({w.name})"
            for w in scope.reputation.windows
            if w.sends
        )
        or "-"
    )


_HEADERS = ("scope", "backlog", "in flight", "sent / limit", "state", "limits from", "bounce / complaint")


def _rows(stats: Stats) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for scope in [stats.global_, *stats.tenants]:
        name = "(global)" if scope is stats.global_ else scope.scope
        rows.append(
            (
                name,
                str(scope.backlog),
                str(scope.inflight),
                _usage(scope.windows),
                _state(scope),
                scope.limits_source,
                _rates(scope),
            )
        )
    return rows


def render_text(stats: Stats) -> str:
    """A plain table, for a terminal or a log."""
    rows = [_HEADERS, *_rows(stats)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.append(_caption(stats))
    lines.append(_reconciled(stats))
    lines += [f"{t}: {p.describe(stats.at_ms)}" for t, p in sorted(stats.webhooks.items())]
    for scope in stats.tenants:
        if scope.guard is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(scope.guard.at_ms / 1000))
            guard = scope.guard
            lines.append(
                f"{scope.scope}: {guard.level} by the reputation guard at {stamp} UTC: {guard.reason}"
            )
        for provider, hold in sorted(scope.provider_holds.items()):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(hold.at_ms / 1000))
            lines.append(
                f"{scope.scope}: mail to {provider} held by the reputation guard at {stamp} UTC: "
                + hold.reason
            )
        if scope.warmup is not None:
            lines.append(f"{scope.scope}: {scope.warmup.describe(stats.at_ms)}")
        if scope.ses_disabled is not None:
            v = scope.ses_disabled
            lines.append(
                f"{scope.scope}: SES tenant {v.ses_tenant} disabled (AWS-managed {v.aws_managed}, "
                f"customer-managed {v.customer_managed})"
            )
    return "\n".join(lines)


def _reconciled(stats: Stats) -> str:
    again, dead = stats.reconciled.get("handed_again", 0), stats.reconciled.get("dead", 0)
    return f"jobs SQS lost: {again} handed to SQS again, {dead} dead-lettered"


def _caption(stats: Stats) -> str:
    caption = f"replicas alive: {len(stats.replicas)} ({', '.join(stats.replicas) or 'none'})"
    if stats.memory is not None:
        caption += "; " + stats.memory.describe()
    if stats.known_tenants > len(stats.tenants):
        caption += (
            f"; {len(stats.tenants)} of {stats.known_tenants} tenants shown (those with the largest backlogs)"
        )
    return caption


def render_table(stats: Stats) -> Table:
    """The same as :func:`render_text`, as a rich table (``--watch``)."""
    from rich.table import Table

    stamp = time.strftime("%H:%M:%S", time.localtime(stats.at_ms / 1000))
    table = Table(
        title=f"fairpost at {stamp}",
        caption=_caption(stats) + "; " + _reconciled(stats),
    )
    for header in _HEADERS:
        table.add_column(header, justify="right" if header in ("backlog", "in flight") else "left")
    for row in _rows(stats):
        style = "bold" if row[0] == "(global)" else None
        table.add_row(*row, style=style)
    return table
