"""``fairpost cancel`` and ``fairpost dead list|show|replay|purge``, and the
parsers of ``fairpost send``'s lifecycle options (``--send-at``, ``--attach``,
``--header``). Like ``send`` and ``status`` they need only Redis.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from fairpost.config import Settings
from fairpost.dispatcher.errors import TooLateToCancel
from fairpost.mailer.ops.console import print_json, unreachable_redis

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w``."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 15m, 12h or 7d")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def parse_send_at(text: str) -> datetime:
    """ISO 8601 with an offset (``2030-01-31T09:00:00+01:00``, ``...Z``), or ``+DURATION`` from now.

    A time without an offset is passed on as given: the SDK refuses it, naming ``send_at``.
    """
    if text.startswith("+"):
        return datetime.now(UTC) + parse_duration(text[1:])
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (2030-01-31T09:00:00+01:00) or +DURATION (+15m)"
        ) from None


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME: VALUE")
    return name.strip(), value.strip()


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.sdk.client import MailClient

    try:
        with MailClient(settings) as client:
            was = client.cancel(args.job_id)
    except TooLateToCancel as exc:
        if args.json:
            print_json({"job_id": args.job_id, "cancelled": False, "state": exc.state})
        print(f"fairpost: job {args.job_id} is {exc.state}: too late to cancel", file=sys.stderr)
        return 1
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    if args.json:
        print_json({"job_id": args.job_id, "cancelled": True, "was": was})
    elif was == "dead":
        print(f"job {args.job_id} was cancelled already")
    else:
        print(f"cancelled job {args.job_id} (it was {was}); it is a dead letter with reason 'cancelled'")
    return 0


def cmd_dead(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.sdk.dead import DeadLetters

    try:
        with DeadLetters(settings) as dead:
            return int(_DEAD_ACTIONS[args.dead_command](args, dead))
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)


def _dead_list(args: argparse.Namespace, dead: Any) -> int:
    letters = dead.list(args.tenant, limit=args.limit)
    if args.json:
        print_json([letter.to_json() for letter in letters])
        return 0
    if not letters:
        print("no dead letters" + (f" for tenant {args.tenant}" if args.tenant else ""))
        return 0
    print(f"{'JOB ID':40} {'TENANT':16} {'DIED AT (UTC)':20} {'ATTEMPTS':>8}  REASON")
    for letter in letters:
        died = letter.died_at.strftime("%Y-%m-%d %H:%M:%S") if letter.died_at else "-"
        reason = letter.reason if len(letter.reason) <= 60 else letter.reason[:57] + "..."
        print(f"{letter.job_id:40} {letter.tenant_id:16} {died:20} {letter.attempts:>8}  {reason}")
    return 0


def _dead_show(args: argparse.Namespace, dead: Any) -> int:
    letter = dead.show(args.job_id)
    data = letter.to_json()
    if args.json:
        print_json(data)
        return 0
    for name, value in data.items():
        if value is not None:
            print(f"{name:15} {value}")
    return 0


def _dead_replay(args: argparse.Namespace, dead: Any) -> int:
    chosen = [args.job_id is not None, args.tenant is not None, args.all]
    if sum(chosen) != 1:
        print(
            "fairpost: usage: dead replay JOB_ID | dead replay --tenant T | dead replay --all",
            file=sys.stderr,
        )
        return 2
    if args.job_id is not None:
        dead.replay(args.job_id)  # NotReplayable / UnknownJob: main prints them, exit 1
        if args.json:
            print_json({"replayed": [args.job_id], "not_replayable": {}})
        else:
            print(f"replayed job {args.job_id}: back in its tenant's queue")
        return 0
    report = dead.replay_tenant(args.tenant) if args.tenant is not None else dead.replay_all()
    if args.json:
        print_json(report.to_json())
    else:
        print(f"replayed {len(report.replayed)} dead letters")
        for job_id, why in report.not_replayable.items():
            print(f"  skipped {job_id}: {why}")
    return 0


def _dead_purge(args: argparse.Namespace, dead: Any) -> int:
    if args.tenant is None and args.older_than is None and not args.all:
        print("fairpost: usage: dead purge --tenant T | --older-than DURATION | --all", file=sys.stderr)
        return 2
    count = dead.purge(tenant=args.tenant, older_than=args.older_than, everything=args.all)
    if args.json:
        print_json({"purged": count})
    else:
        print(f"purged {count} dead letters")
    return 0


_DEAD_ACTIONS = {"list": _dead_list, "show": _dead_show, "replay": _dead_replay, "purge": _dead_purge}


def add_commands(sub: Any) -> None:
    """Add ``cancel`` and ``dead`` to the ``fairpost`` parser's subcommands."""
    cancel = sub.add_parser("cancel", help="stop a job not yet handed to SQS (scheduled, queued or claimed)")
    cancel.add_argument("job_id")
    cancel.add_argument("--json", action="store_true")
    cancel.set_defaults(handler=cmd_cancel)

    dead = sub.add_parser("dead", help="undelivered jobs, kept with reason, attempts and last error")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True, metavar="ACTION")
    dlist = dead_sub.add_parser("list", help="dead letters, newest first")
    dlist.add_argument("--tenant")
    dlist.add_argument("--limit", type=int)
    dlist.add_argument("--json", action="store_true")
    dshow = dead_sub.add_parser("show", help="one dead letter in full")
    dshow.add_argument("job_id")
    dshow.add_argument("--json", action="store_true")
    dreplay = dead_sub.add_parser(
        "replay",
        help="back to the tenant's queue (attempts from 0, quotas apply): JOB_ID, --tenant T or --all",
    )
    dreplay.add_argument("job_id", nargs="?")
    dreplay.add_argument("--tenant")
    dreplay.add_argument("--all", action="store_true")
    dreplay.add_argument("--json", action="store_true")
    dpurge = dead_sub.add_parser(
        "purge", help="delete dead letters for good: --tenant T, --older-than 7d, --all"
    )
    dpurge.add_argument("--tenant")
    dpurge.add_argument("--older-than", type=parse_duration, metavar="DURATION")
    dpurge.add_argument("--all", action="store_true")
    dpurge.add_argument("--json", action="store_true")
    for parser in (dlist, dshow, dreplay, dpurge):
        parser.add_argument(
            "--pool", dest="in_pool", metavar="POOL", help="the dead letters of this pool (default: default)"
        )
        parser.set_defaults(handler=cmd_dead)
