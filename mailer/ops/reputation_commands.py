"""``fairpost suppression`` and ``fairpost ses-tenants``: the reputation side of operations."""

from __future__ import annotations

import argparse
from typing import Any

from fairpost.config import Settings
from fairpost.dispatcher.replies import text
from fairpost.mailer.ops.console import print_json, unreachable_redis


def cmd_suppression(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.sdk.suppression import Suppressions

    action = args.suppression_command
    try:
        with Suppressions(settings) as lists:
            if action == "list":
                entries = lists.list(args.tenant)
                if args.json:
                    print_json({"tenant": args.tenant, "suppressed": [e.to_json() for e in entries]})
                else:
                    for e in entries:
                        since = e.since.isoformat() if e.since else "-"
                        print(f"{e.address}  {e.reason}  {since}")
                    print(f"{len(entries)} suppressed for tenant {args.tenant}")
                return 0
            changed = (
                lists.add(args.tenant, args.address)
                if action == "add"
                else lists.remove(args.tenant, args.address)
            )
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    verb = "suppressed" if action == "add" else "no longer suppressed"
    if args.json:
        print_json({"tenant": args.tenant, "changed": changed, "action": action})
    else:
        print(f"tenant {args.tenant}: address {verb}" + ("" if changed else " (it was already)"))
    return 0


def cmd_ses_tenants_sync(args: argparse.Namespace, settings: Settings) -> int:
    import contextlib

    import boto3
    import redis

    from fairpost.dispatcher import connect
    from fairpost.mailer.ops.ses_tenants import sync_tenants
    from fairpost.mailer.sdk.keys import MailKeys

    seen: set[str] = set()
    if settings.ses_tenant_names == "tenant_id":
        # Every tenant that ever enqueued gets its SES tenant too.
        try:
            with contextlib.closing(connect.redis_client(settings)) as client:
                members: Any = client.smembers(MailKeys(settings.key_prefix).tenants())
                seen = {text(m) for m in members}
        except (redis.RedisError, OSError) as exc:
            return unreachable_redis(settings, exc)
    with contextlib.closing(boto3.client("sesv2")) as ses:
        report = sync_tenants(ses, settings, seen=seen, dry_run=args.dry_run)
    if args.json:
        print_json({"dry_run": args.dry_run, "tenants": {e.tenant: e.to_json() for e in report}})
        return 0
    would = "would " if args.dry_run else ""
    for e in report:
        parts = []
        if e.created:
            parts.append(f"{would}create SES tenant {e.ses_tenant}")
        parts += [f"{would}associate {arn}" for arn in e.associated]
        parts += [f"differs: SES also has {arn} associated" for arn in e.extra]
        print(f"{e.tenant} → {e.ses_tenant}: " + ("; ".join(parts) or "in sync"))
    changed = sum(1 for e in report if e.changed)
    print(f"{len(report)} SES tenants, {changed} {'to change' if args.dry_run else 'changed'}")
    return 0


def add_commands(sub: Any) -> None:
    """Add ``suppression`` and ``ses-tenants`` to the ``fairpost`` parser's subcommands."""
    supp = sub.add_parser(
        "suppression", help="a tenant's suppressed addresses (bounced, complained, or added)"
    )
    supp_sub = supp.add_subparsers(dest="suppression_command", required=True, metavar="ACTION")
    for action, summary in (
        ("list", "the tenant's suppressed addresses"),
        ("add", "never send the tenant's mail to ADDRESS"),
        ("remove", "let the tenant send to ADDRESS again"),
    ):
        cmd = supp_sub.add_parser(action, help=summary)
        cmd.add_argument("tenant")
        if action != "list":
            cmd.add_argument("address")
        else:
            cmd.set_defaults(address=None)
        cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(handler=cmd_suppression)

    tenants = sub.add_parser("ses-tenants", help="SES tenants (reputation isolation) for fairpost's tenants")
    tenants_sub = tenants.add_subparsers(dest="ses_tenants_command", required=True, metavar="ACTION")
    sync = tenants_sub.add_parser(
        "sync", help="create missing SES tenants and associate their identities and configuration sets"
    )
    sync.add_argument("--json", action="store_true")
    sync.add_argument("--dry-run", action="store_true", help="report what would change; change nothing")
    sync.set_defaults(handler=cmd_ses_tenants_sync)
