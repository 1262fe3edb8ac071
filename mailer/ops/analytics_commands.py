"""``fairpost analytics [TENANT] [--days N] [--json]``: deliverability by mailbox provider."""

from __future__ import annotations

import argparse
from typing import Any

from fairpost.config import Settings
from fairpost.mailer.ops.console import print_json
from fairpost.mailer.sdk.rollups import Report

__all__ = ["add_parser", "format_report"]

_COLUMNS = ("sent", "delivered", "hard_bounced", "soft_bounced", "complained", "suppressed", "unsubscribed")
_HEADS = ("sent", "delivered", "hard", "soft", "complaints", "suppressed", "unsub")


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "analytics",
        help="a tenant's deliverability by mailbox provider (sent, delivered, bounced, complained ...)",
        description="Recipients sent, delivered, bounced (hard, soft), complained of, suppressed and "
        "unsubscribed, per mailbox provider, over the last days (UTC); each rate names what it is "
        "counted among. Without TENANT: every tenant that counted any.",
    )
    parser.add_argument("tenant", nargs="?", help="the tenant (default: every tenant)")
    parser.add_argument("--days", type=_days, default=14, help="days, today's included (default 14)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=cmd_analytics)


def _days(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 400:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 400")
    return int(value)


def cmd_analytics(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.sdk.rollups import Deliverability

    with Deliverability(settings) as book:
        reports = [book.report(args.tenant, days=args.days)] if args.tenant else book.reports(days=args.days)
    if args.json:
        print_json({"days": args.days, "tenants": [r.to_json() for r in reports]})
        return 0
    if not reports:
        print(f"no deliverability counted in the last {args.days} days")
    for report in reports:
        print("\n".join(format_report(report)))
    return 0


def format_report(report: Report) -> list[str]:
    """The report as text lines: a table of counts, then each provider's rates."""
    span = f"{report.days[0]} to {report.days[-1]}" if report.days else ""
    lines = [f"tenant {report.tenant}, {len(report.days)} days ({span}, UTC), recipients:"]
    if not report.providers:
        return [*lines, "  nothing counted"]
    rows = [("provider", *_HEADS)] + [
        (p.provider, *(str(p.counts[c]) for c in _COLUMNS)) for p in report.providers
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += [
        "  "
        + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    for p in report.providers:
        lines.append(
            f"  {p.provider}: bounce rate {p.bounce_rate.text()}; complaint rate {p.complaint_rate.text()}; "
            f"delivery rate {p.delivery_rate.text()}"
        )
    return lines
