"""``fairpost unsubscribes``: a tenant's unsubscribed recipients (issue #42)."""

from __future__ import annotations

import argparse
from typing import Any

from fairpost.config import Settings
from fairpost.mailer.ops.console import print_json, unreachable_redis


def cmd_unsubscribes(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.sdk.unsubscribes import Unsubscribes

    action = args.unsubscribes_command
    try:
        with Unsubscribes(settings) as unsubscribes:
            if action == "list":
                entries = unsubscribes.list(args.tenant)
                if args.json:
                    print_json({"tenant": args.tenant, "unsubscribed": [e.to_json() for e in entries]})
                else:
                    for e in entries:
                        since = e.since.isoformat() if e.since else "-"
                        print(f"{e.address}  {','.join(e.topics)}  {e.source}  {since}")
                    print(f"{len(entries)} unsubscribed from tenant {args.tenant}")
                return 0
            if action == "add":
                changed = unsubscribes.add(args.tenant, args.address, args.topic)
            else:
                changed = unsubscribes.remove(args.tenant, args.address, args.topic)
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    what = f"topic {args.topic}" if args.topic else "every topic"
    verb = "unsubscribed from" if action == "add" else "subscribed again to"
    if args.json:
        print_json({"tenant": args.tenant, "changed": changed, "action": action, "topic": args.topic})
    else:
        print(f"tenant {args.tenant}: address {verb} {what}" + ("" if changed else " (it was already)"))
    return 0


def add_commands(sub: Any) -> None:
    """Add ``unsubscribes`` to the ``fairpost`` parser's subcommands (``unsubscribe-server``,
    a daemon part, is the command line's own)."""
    unsub = sub.add_parser(
        "unsubscribes", help="a tenant's recipients who stopped its notification mail (by topic, or all)"
    )
    unsub_sub = unsub.add_subparsers(dest="unsubscribes_command", required=True, metavar="ACTION")
    for action, summary in (
        ("list", "the tenant's unsubscribed addresses, their topics and how they unsubscribed"),
        ("add", "stop the tenant's notification mail of --topic (default: every topic) to ADDRESS"),
        ("remove", "re-subscribe ADDRESS (record the recipient's consent first)"),
    ):
        cmd = unsub_sub.add_parser(action, help=summary, description=summary)
        cmd.add_argument("tenant")
        if action != "list":
            cmd.add_argument("address")
            cmd.add_argument("--topic", help="one topic (default: every topic)")
        cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(handler=cmd_unsubscribes)
