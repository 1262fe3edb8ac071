"""The ``fairpost`` command.

Commands that only talk to Redis (``send``, ``status``) import nothing from
the daemon's dependencies, so they work with the SDK alone installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from config import ConfigError, FairpostError, Settings, load_settings

Command = Callable[[argparse.Namespace, Settings], int]


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from mailer.daemon import run_daemon
    from mailer.logs import configure_logging

    configure_logging(settings.log_level)
    return asyncio.run(run_daemon(settings, args.role))


def cmd_init_aws(args: argparse.Namespace, settings: Settings) -> int:
    import boto3

    from mailer.queue_setup import init_queue

    url, differ = init_queue(boto3.client("sqs"), settings)
    if args.json:
        _print_json(
            {"queue_url": url, "differs": {k: {"have": h, "want": w} for k, (h, w) in differ.items()}}
        )
    else:
        print(f"queue ready: {url}")
        for name, (have, want) in differ.items():
            print(f"  attribute {name} is {have!r}; fairpost expects {want!r}")
    return 0


def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    from mailer.client import MailClient

    with MailClient(settings) as client:
        job_id = client.send(
            args.tenant,
            sender=args.sender,
            to=args.to,
            cc=args.cc or (),
            bcc=args.bcc or (),
            subject=args.subject,
            text=args.text,
            html=args.html,
            priority=args.priority,
        )
    print(job_id)
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from mailer.client import MailClient

    with MailClient(settings) as client:
        status = client.status(args.job_id)
    if args.json:
        _print_json(status.to_json())
    else:
        for name, value in status.to_json().items():
            if value is not None:
                print(f"{name:15} {value}")
    return 0


def cmd_check_config(args: argparse.Namespace, settings: Settings) -> int:
    data = settings.redacted()
    if args.json:
        _print_json(data)
    else:
        print("settings are valid:")
        for name, value in data.items():
            print(f"  {name} = {json.dumps(value, default=str)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairpost",
        description="Fair, quota-safe multi-tenant mail through Amazon SES. Settings come from "
        "FAIRPOST_* variables and FAIRPOST_CONFIG_FILE; AWS from the standard AWS_* variables.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument(
        "--role",
        choices=["all", "dispatcher", "sender"],
        default="all",
        help="dispatcher: Redis → SQS; sender: SQS → SES; all: both (default)",
    )
    run.set_defaults(handler=cmd_run)

    init = sub.add_parser(
        "init-aws", help="create the SQS FIFO queue (idempotent) and report differing attributes"
    )
    init.add_argument("--json", action="store_true")
    init.set_defaults(handler=cmd_init_aws)

    send = sub.add_parser("send", help="enqueue one mail and print its job id")
    send.add_argument("--tenant", required=True)
    send.add_argument("--from", dest="sender", required=True)
    send.add_argument("--to", action="append", required=True, help="repeat for several recipients")
    send.add_argument("--cc", action="append")
    send.add_argument("--bcc", action="append")
    send.add_argument("--subject", required=True)
    send.add_argument("--text")
    send.add_argument("--html")
    send.add_argument("--priority", choices=["high", "normal", "low"], default="normal")
    send.set_defaults(handler=cmd_send)

    status = sub.add_parser("status", help="show a job's state")
    status.add_argument("job_id")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_status)

    check = sub.add_parser("check-config", help="validate and print the effective settings (secrets masked)")
    check.add_argument("--json", action="store_true")
    check.set_defaults(handler=cmd_check_config)

    demo = sub.add_parser(
        "demo", help="run fairpost on an embedded Redis and AWS emulator with a sample load"
    )
    demo.add_argument(
        "--duration", type=float, default=None, help="seconds of load (default: the scenario's)"
    )
    demo.add_argument("--replicas", type=int, default=2)
    demo.add_argument("--scenario", default="default")
    demo.add_argument("--output", default="demo-output", help="where the summary and chart go")
    demo.set_defaults(handler=cmd_demo)
    return parser


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from mailer.demo import run_demo

    code: int = run_demo(args, settings)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"fairpost: {exc}", file=sys.stderr)
        return 1
    handler: Command = args.handler
    try:
        return handler(args, settings)
    except FairpostError as exc:
        print(f"fairpost: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
