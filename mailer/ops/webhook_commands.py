"""``fairpost webhook``: a tenant's signed webhook endpoints (docs/outcomes.md).

``add`` and ``rotate-secret`` print the endpoint's secret, the only times it is
ever shown; ``--json`` on every action prints one JSON document.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from fairpost.config import Settings
from fairpost.mailer.ops.console import print_json
from fairpost.mailer.sdk.outcomes.feed import EVENT_TYPES

__all__ = ["add_parser"]

_ACTIONS = {
    "add": "register TENANT's endpoint URL (prints its secret, once)",
    "list": "every endpoint (of --tenant only)",
    "remove": "delete ENDPOINT and what is still queued for it",
    "enable": "deliver to ENDPOINT again, starting with what waited",
    "disable": "stop delivering to ENDPOINT (new events are not queued meanwhile)",
    "rotate-secret": "a new secret for ENDPOINT (prints it, once); the old one signs too for a while",
    "attempts": "ENDPOINT's latest delivery attempts, newest first",
    "replay": "queue ENDPOINT's tenant's events since --since again, with their original ids",
}


def cmd_webhook(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.sdk.outcomes.endpoints import Webhooks

    action: str = args.webhook_command
    with Webhooks(settings) as hooks:
        if action == "add":
            made = hooks.add(args.tenant, args.url, events=args.event or ())
            return _show(args, made.to_json(), f"endpoint {made.id}\nsecret {made.secret}")
        if action == "list":
            endpoints = hooks.list(args.tenant)
            rows = [_row(e.to_json()) for e in endpoints]
            return _show(args, [e.to_json() for e in endpoints], "\n".join([*rows, f"{len(rows)} endpoints"]))
        if action == "rotate-secret":
            made = hooks.rotate_secret(args.endpoint)
            return _show(args, made.to_json(), f"endpoint {made.id}\nsecret {made.secret}")
        if action == "attempts":
            attempts = hooks.attempts(args.endpoint, args.limit)
            lines = [_attempt(a) for a in attempts]
            return _show(args, attempts, "\n".join(lines) or "no attempts yet")
        if action == "replay":
            queued = hooks.replay(args.endpoint, args.since)
            report = {"id": args.endpoint, "since": args.since.isoformat(), "queued": queued}
            return _show(args, report, f"{queued} events queued again for {args.endpoint}")
        getattr(hooks, action)(args.endpoint)
    return _show(args, {"id": args.endpoint, "action": action}, f"endpoint {args.endpoint}: {action}d")


def _show(args: argparse.Namespace, data: Any, text: str) -> int:
    if args.json:
        print_json(data)
    else:
        print(text)
    return 0


def _row(e: dict[str, Any]) -> str:
    state = "enabled" if e["enabled"] else f"disabled ({e['disabled_reason']})"
    events = ",".join(e["events"]) or "every event"
    return f"{e['id']}  {e['tenant']}  {e['url']}  {state}  {events}  pending {e['pending']}"


def _attempt(a: dict[str, Any]) -> str:
    status = a.get("status") or "-"
    after = a.get("next_attempt_in_seconds")
    more = f", next in {after:.1f}s" if after is not None else ""
    error = f" ({a['error']})" if a.get("error") else ""
    head = f"{a.get('at')}  {a.get('event_id')}  {a.get('type')}  #{a.get('attempt')}"
    return f"{head}  {a.get('result')}  {status}{error}{more}"


def _since(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError("give the time with its offset (2025-05-01T12:00:00Z)")
    return moment


def add_parser(sub: Any) -> None:
    """Add ``webhook`` to the ``fairpost`` parser's subcommands."""
    hook = sub.add_parser("webhook", help="a tenant's signed webhook endpoints (the outcome feed, pushed)")
    actions = hook.add_subparsers(dest="webhook_command", required=True, metavar="ACTION")
    for action, summary in _ACTIONS.items():
        cmd = actions.add_parser(action, help=summary, description=summary)
        if action == "add":
            cmd.add_argument("tenant")
            cmd.add_argument("url")
            cmd.add_argument(
                "--event", action="append", choices=EVENT_TYPES, metavar="TYPE",
                help="only events of this type (repeat for more; default: every type)",
            )  # fmt: skip
        elif action == "list":
            cmd.add_argument("--tenant")
        else:
            cmd.add_argument("endpoint")
        if action == "attempts":
            cmd.add_argument("--limit", type=int, default=50)
        if action == "replay":
            cmd.add_argument("--since", type=_since, required=True, help="ISO 8601, with its offset")
        cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(handler=cmd_webhook)
