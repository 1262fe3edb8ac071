"""``fairpost quota``: show or change the limits live (overrides in Redis, no restart)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fairpost.config import Settings
from fairpost.mailer.ops.console import print_json, unreachable_redis


def cmd_quota_show(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.quota.overrides import QuotaAdmin
    from fairpost.mailer.quota.stream_limits import resolve_stream

    try:
        with QuotaAdmin(settings) as admin:
            stream = resolve_stream(settings, admin.overrides(), args.tenant) if args.tenant else None
            shown = [admin.global_limits(), stream] if stream else admin.show(args.tenant)
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    if args.json:
        print_json({"global": shown[0].to_json(), "tenants": {e.scope: e.to_json() for e in shown[1:]}})
        return 0
    for eff in shown:
        none = "auto (no daemon has read SES yet)" if eff is shown[0] else "none of its own"
        limits = eff.to_json()["limits"] or none
        name = "(global)" if eff is shown[0] else eff.scope
        print(f"{name:20} {limits:40} from {eff.source}{'  PAUSED' if eff.paused else ''}")
    return 0


def cmd_quota_set(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.config.limits import format_limits
    from fairpost.mailer.quota.overrides import QuotaAdmin

    if len(args.values) != (1 if args.global_ else 2):
        print("fairpost: usage: quota set TENANT LIMITS | quota set --global LIMITS", file=sys.stderr)
        return 2
    try:
        with QuotaAdmin(settings) as admin:
            if args.global_:
                windows = admin.set_global_limits(args.values[0])
                scope = "global limits"
            else:
                windows = admin.set_tenant_limits(args.values[0], args.values[1])
                scope = f"tenant {args.values[0]}"
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    print(f"{scope}: {format_limits(windows)} (an override: every replica applies it within 5 s)")
    return 0


def cmd_quota_reset(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.quota.overrides import QuotaAdmin

    if (args.tenant is None) == (not args.global_):
        print("fairpost: usage: quota reset TENANT | quota reset --global", file=sys.stderr)
        return 2
    try:
        with QuotaAdmin(settings) as admin:
            if args.global_:
                removed, scope = admin.reset_global_limits(), "global limits"
            else:
                removed, scope = admin.reset_tenant_limits(args.tenant), f"tenant {args.tenant}"
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    print(f"{scope}: back to the settings" if removed else f"{scope}: had no override")
    return 0


def add_commands(sub: Any) -> None:
    """Add ``quota show|set|reset`` to the ``fairpost`` parser's subcommands."""
    quota = sub.add_parser("quota", help="show or change quotas live (overrides in Redis, no restart)")
    quota_sub = quota.add_subparsers(dest="quota_command", required=True, metavar="ACTION")
    qshow = quota_sub.add_parser("show", help="the limits in force and where they come from")
    qshow.add_argument("tenant", nargs="?")
    qshow.add_argument("--json", action="store_true")
    qshow.set_defaults(handler=cmd_quota_show)
    qset = quota_sub.add_parser(
        "set", help='override a tenant\'s limits (quota set acme "100/minute; 5000/day") or the global ones'
    )
    qset.add_argument("values", nargs="+", metavar="[TENANT] LIMITS")
    qset.add_argument("--global", dest="global_", action="store_true", help="set the global limits")
    qset.set_defaults(handler=cmd_quota_set)
    qreset = quota_sub.add_parser("reset", help="drop an override: the settings apply again")
    qreset.add_argument("tenant", nargs="?")
    qreset.add_argument("--global", dest="global_", action="store_true", help="reset the global limits")
    qreset.set_defaults(handler=cmd_quota_reset)
    for parser in (qshow, qset, qreset):
        parser.add_argument(
            "--pool",
            dest="in_pool",
            metavar="POOL",
            help="a sending pool's (default: the tenant's, or default)",
        )
