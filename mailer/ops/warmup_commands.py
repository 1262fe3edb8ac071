"""``fairpost tenant warmup``: a tenant's warm-up plan, live (docs/operations.md, "Warm-up")."""

from __future__ import annotations

import argparse
from typing import Any

from fairpost.config import Settings
from fairpost.mailer.ops.console import print_json, unreachable_redis

_HELP = (
    "show or change a tenant's warm-up plan live: its limits grow by the plan's steps while its mail is clean"
)
_PLAN_HELP = (
    'start this plan now: steps "LIMITS from OFFSET" separated by |, e.g. '
    '"50/hour; 500/day from 0s | 200/hour from 1 day | none from 7 days"'
)


def add_tenant_parser(sub: Any) -> Any:
    """Add the ``tenant`` command with its ``warmup`` action; return its sub-parsers, for
    the command line to add the other actions (``pause``, ``resume``)."""
    tenant = sub.add_parser("tenant", help="pause, resume or warm up a tenant live")
    actions = tenant.add_subparsers(dest="action", required=True, metavar="ACTION")
    warmup = actions.add_parser("warmup", help=_HELP, description=_HELP)
    warmup.add_argument("tenant")
    what = warmup.add_mutually_exclusive_group()
    what.add_argument("--plan", help=_PLAN_HELP)
    what.add_argument(
        "--default", action="store_true", help="start the default plan (FAIRPOST_WARMUP__PLAN) now"
    )
    what.add_argument("--skip", action="store_true", help="end its warm-up: its own limits apply")
    what.add_argument("--restart", action="store_true", help="start its current plan over, now")
    warmup.add_argument("--json", action="store_true")
    warmup.set_defaults(handler=cmd_tenant_warmup)
    return actions


def cmd_tenant_warmup(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.quota.warmup import WarmupView
    from fairpost.mailer.quota.warmup_admin import WarmupAdmin

    tenant: str = args.tenant
    try:
        with WarmupAdmin(settings) as admin:
            if args.skip:
                ended = admin.skip(tenant)
                if args.json:
                    print_json({"tenant": tenant, "warmup": None, "ended": ended})
                else:
                    print(f"tenant {tenant}: " + ("warm-up ended" if ended else "was not warming up"))
                return 0
            if args.plan is not None:
                admin.set_plan(tenant, args.plan)
            elif args.default:
                admin.use_default(tenant)
            elif args.restart:
                admin.restart(tenant)
            views, now_ms = admin.show(tenant), admin.now_ms()
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    view: WarmupView | None = views[0] if views else None
    if args.json:
        print_json({"tenant": tenant, "warmup": None if view is None else view.to_json()})
    elif view is None:
        print(f"tenant {tenant}: not warming up (its own limits apply)")
    else:
        changed = args.plan is not None or args.default or args.restart
        print(f"tenant {tenant}: {view.describe(now_ms)}")
        print(f"  plan ({view.place.source}): {view.place.plan}")
        if changed:
            print("  every replica applies it within about 2 s")
    return 0
