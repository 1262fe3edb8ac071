"""``fairpost send`` and ``fairpost status``: one mail, enqueued and looked at. They
talk to Redis only, through the SDK, so they work with the SDK alone installed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fairpost.config import Settings
from fairpost.mailer.ops.console import print_json
from fairpost.mailer.ops.lifecycle_commands import parse_header, parse_send_at

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """One mail: enqueue it, see its state."""
    send = sub.add_parser("send", help="enqueue one mail and print its job id")
    send.add_argument("--tenant", required=True)
    send.add_argument("--from", dest="sender", help="default: the tenant's default_sender setting")
    send.add_argument("--to", action="append", required=True, help="repeat for several recipients")
    send.add_argument("--cc", action="append")
    send.add_argument("--bcc", action="append")
    send.add_argument("--subject", required=True)
    send.add_argument("--text")
    send.add_argument("--html")
    send.add_argument("--priority", choices=["high", "normal", "low"], default="normal")
    send.add_argument(
        "--header", action="append", type=parse_header, metavar="'NAME: VALUE'", help="repeat for several"
    )
    send.add_argument("--attach", action="append", metavar="PATH", help="a file to attach; repeatable")
    send.add_argument(
        "--idempotency-key", help="a repeat with this key (same tenant, within FAIRPOST_IDEMPOTENCY_TTL) "
        "prints the first job's id and enqueues nothing"
    )  # fmt: skip
    send.add_argument(
        "--send-at", type=parse_send_at, metavar="TIME", help="ISO 8601 with offset, or +DURATION (+15m)"
    )
    send.set_defaults(handler=cmd_send)

    status = sub.add_parser("status", help="show a job's state")
    status.add_argument("job_id")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_status)


def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.sdk.attachments import Attachment
    from fairpost.mailer.sdk.client import MailClient

    try:
        attachments = [Attachment.from_path(path) for path in args.attach or ()]
    except OSError as exc:
        print(f"fairpost: cannot read attachment: {exc}", file=sys.stderr)
        return 1
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
            headers=dict(args.header) if args.header else None,
            attachments=attachments,
            idempotency_key=args.idempotency_key,
            send_at=args.send_at,
        )
    print(job_id)
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.sdk.client import MailClient

    with MailClient(settings) as client:
        status = client.status(args.job_id)
    if args.json:
        print_json(status.to_json())
    else:
        for name, value in status.to_json().items():
            if value is not None:
                print(f"{name:15} {value}")
    return 0
