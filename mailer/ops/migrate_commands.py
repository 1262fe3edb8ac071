"""``fairpost migrate``: the store moved to this release's key layout (dispatcher/migrate.py).
Like ``send`` it needs only Redis."""

from __future__ import annotations

import argparse

from fairpost.config import Settings
from fairpost.dispatcher.connect import redis_client
from fairpost.dispatcher.migrate import Migration
from fairpost.mailer.sdk.keys import MailKeys


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    client = redis_client(settings)
    try:
        migration = Migration(client, MailKeys(settings.key_prefix), say=lambda line: print(line, flush=True))
        migration.batch = args.batch
        if args.dry_run:
            migration.dry_run()
        else:
            migration.run(wait_seconds=args.wait)
    finally:
        client.close()
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = (
        "move the Redis store to this release's key layout: locked, idempotent, resumable after a kill "
        "(CHANGELOG.md's upgrade notes say when a release needs it)"
    )
    migrate = sub.add_parser("migrate", help=text, description=text)
    migrate.add_argument("--dry-run", action="store_true", help="say what it would do; write nothing")
    migrate.add_argument("--batch", type=int, default=500, help="records a step (a SCAN page)")
    migrate.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for another migration's lock"
    )
    migrate.set_defaults(handler=cmd_migrate)
