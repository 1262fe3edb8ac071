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

from fairpost import __version__
from fairpost.config import ConfigError, FairpostError, Settings, load_settings
from fairpost.mailer.ops.analytics_commands import add_parser as add_analytics_command
from fairpost.mailer.ops.console import aws_error, fail, print_json, unreachable_redis
from fairpost.mailer.ops.doctor import add_parser as add_doctor
from fairpost.mailer.ops.lifecycle_commands import add_commands as add_lifecycle_commands
from fairpost.mailer.ops.mail_commands import add_commands as add_mail_commands
from fairpost.mailer.ops.migrate_commands import add_parser as add_migrate_command
from fairpost.mailer.ops.pool_commands import add_parser as add_pools_command
from fairpost.mailer.ops.pool_commands import add_tenant_actions as add_pool_actions
from fairpost.mailer.ops.pool_commands import tenant_pool_settings
from fairpost.mailer.ops.quota_commands import add_commands as add_quota_commands
from fairpost.mailer.ops.redis_check import redis_findings
from fairpost.mailer.ops.reputation_commands import add_commands as add_reputation_commands
from fairpost.mailer.ops.unsubscribe_commands import add_commands as add_unsubscribe_commands
from fairpost.mailer.ops.warmup_commands import add_tenant_parser
from fairpost.mailer.ops.webhook_commands import add_parser as add_webhook_commands

Command = Callable[[argparse.Namespace, Settings], int]


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.daemon.app import run_daemon
    from fairpost.mailer.daemon.logs import configure_logging

    configure_logging(settings.log_level)
    return asyncio.run(run_daemon(settings, args.role))


def cmd_console(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.console.app import serve
    from fairpost.mailer.daemon.logs import configure_logging

    configure_logging(settings.log_level)
    return asyncio.run(serve(settings))


def cmd_unsubscribe_server(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.daemon.logs import configure_logging
    from fairpost.mailer.daemon.unsubscribe_server import serve

    configure_logging(settings.log_level)
    return asyncio.run(serve(settings))


def cmd_init_aws(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.config.pools import pool_names, pool_settings
    from fairpost.mailer.ops.pool_aws import pool_client
    from fairpost.mailer.ops.queue_setup import init_events_queue, init_queue, queue_warnings

    if args.pool not in pool_names(settings):
        return fail(f"no pool {args.pool!r}: one of {', '.join(pool_names(settings))}")
    own = settings.pools.get(args.pool)
    if own is not None and own.queue_url:
        return fail(f"pool {args.pool}'s queue is named by URL (another account's): create it there")
    with pool_client(settings, args.pool, "sqs") as sqs:
        url, differ = init_queue(sqs, pool_settings(settings, args.pool))
        events = init_events_queue(sqs, pool_settings(settings, args.pool)) if args.events else None
        warnings = queue_warnings(sqs, url)
    if args.json:
        report: dict[str, object] = {
            "queue_url": url,
            "differs": {k: {"have": h, "want": w} for k, (h, w) in differ.items()},
            "warnings": warnings,
        }
        if events is not None:
            report["events_queue_url"] = events[0]
            report["events_differs"] = {k: {"have": h, "want": w} for k, (h, w) in events[1].items()}
        print_json(report)
    else:
        print(f"queue ready: {url}")
        for name, (have, want) in differ.items():
            print(f"  attribute {name} is {have!r}; fairpost expects {want!r}")
        if events is not None:
            print(f"events queue ready: {events[0]}")
            for name, (have, want) in events[1].items():
                print(f"  attribute {name} is {have!r}; fairpost expects {want!r}")
        for warning in warnings:
            print(f"  warning: {warning}")
    return 0


def cmd_check_config(args: argparse.Namespace, settings: Settings) -> int:
    data = settings.redacted()
    if args.json:
        print_json(data)
    else:
        print("settings are valid:")
        for name, value in data.items():
            print(f"  {name} = {json.dumps(value, default=str)}")
    # The queue's own settings can lose mail too (a redrive policy): on stderr,
    # so that --json stays the settings alone. Checked only where AWS is at hand.
    for warning in _queue_warnings(settings):
        print(f"fairpost: warning: {warning}", file=sys.stderr)
    # And Redis: an allkeys-* policy would lose mail (dispatcher/redis_memory.py).
    found = redis_findings(settings)
    for note in found.notes:
        print(f"fairpost: {note}", file=sys.stderr)
    for warning in found.warnings:
        print(f"fairpost: warning: {warning}", file=sys.stderr)
    for error in found.errors:
        print(f"fairpost: error: {error}", file=sys.stderr)
    return 1 if found.errors else 0


def _queue_warnings(settings: Settings) -> list[str]:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return []  # the SDK alone: no AWS to ask
    from fairpost.mailer.ops.queue_setup import queue_warnings

    quick = Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1})
    try:
        sqs = boto3.client("sqs", config=quick)
    except Exception:
        return []  # no region or credentials configured here
    try:
        url = sqs.get_queue_url(QueueName=settings.queue_name)["QueueUrl"]
        return queue_warnings(sqs, url)
    except Exception as exc:
        return [f"queue {settings.queue_name} not checked ({type(exc).__name__})"]
    finally:
        sqs.close()


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    import redis
    import redis.asyncio

    from fairpost.config.pools import pool_names, pool_settings
    from fairpost.dispatcher.connect import async_redis_client
    from fairpost.mailer.ops.stats import collect_stats
    from fairpost.mailer.ops.stats_render import render_table, render_text
    from fairpost.mailer.sdk.keys import MailKeys

    pool = args.pool or _tenants_pool(settings, args.tenant or [])
    if pool not in pool_names(settings):
        return fail(f"no pool {pool!r}: one of {', '.join(pool_names(settings))}")
    heading = f"pool {pool}\n" if settings.pools else ""
    settings = pool_settings(settings, pool)  # its keys, its global limits, its slot

    async def run() -> None:
        client = async_redis_client(settings)
        keys = MailKeys(settings.key_prefix)
        try:
            stats = await collect_stats(client, keys, settings, tenants=args.tenant)
            if not args.watch:
                if args.json:
                    print_json({"pool": pool, **stats.to_json()})
                else:
                    print(heading + render_text(stats))
                return
            if args.json:  # one JSON object per line, for scripts
                while True:
                    print(json.dumps({"pool": pool, **stats.to_json()}, sort_keys=True), flush=True)
                    await asyncio.sleep(args.interval)
                    stats = await collect_stats(client, keys, settings, tenants=args.tenant)
            from rich.live import Live

            with Live(render_table(stats), auto_refresh=False) as live:
                while True:
                    await asyncio.sleep(args.interval)
                    stats = await collect_stats(client, keys, settings, tenants=args.tenant)
                    live.update(render_table(stats), refresh=True)
        finally:
            await client.aclose()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        return 0
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    return 0


def _tenants_pool(settings: Settings, tenants: list[str]) -> str:
    """The pool the tenants asked for are on (the default pool if none is asked for).
    Raises :class:`ConfigError` naming each one's pool if they are on several."""
    if not settings.pools or not tenants:
        return "default"
    from fairpost.mailer.sdk.pool_admin import Pools

    with Pools(settings) as pools:
        on = {t: pools.pool_of(t) for t in tenants}
    if len(set(on.values())) == 1:
        return next(iter(on.values()))
    where = ", ".join(f"{t} ({p})" for t, p in on.items())
    raise ConfigError(
        [("--tenant", f"the tenants are on several pools: {where}; ask one pool at a time with --pool")]
    )


def cmd_tenant_pause(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.quota.admin import QuotaAdmin

    try:
        with QuotaAdmin(settings) as admin:
            changed = admin.pause(args.tenant) if args.action == "pause" else admin.resume(args.tenant)
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    state = "paused" if args.action == "pause" else "resumed"
    print(f"tenant {args.tenant}: {state}" + ("" if changed else f" (it was {state} already)"))
    if args.ses:
        from fairpost.mailer.ops.ses_tenants import set_customer_status

        print(set_customer_status(settings, args.tenant, enabled=args.action == "resume"))
    return 0


def cmd_health(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.config.pools import pool_settings, served_pools
    from fairpost.mailer.daemon.health import check_heartbeat, check_http

    if settings.http_port is not None and args.replica is None:
        health = check_http(settings.http_port, timeout=args.timeout)
    else:
        # The heartbeat of the first pool this replica serves (each pool's is in its keys).
        beats_in = pool_settings(settings, served_pools(settings)[0])
        health = check_heartbeat(beats_in, args.replica, timeout=args.timeout)
    if args.json:
        print_json(health.to_json())
    else:
        print(("healthy: " if health.ok else "unhealthy: ") + health.detail)
    return 0 if health.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairpost",
        description="Fair, quota-safe multi-tenant mail through Amazon SES. Settings come from "
        "FAIRPOST_* variables and FAIRPOST_CONFIG_FILE; AWS from the standard AWS_* variables.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_service_commands(sub)
    add_mail_commands(sub)
    add_lifecycle_commands(sub)
    add_reputation_commands(sub)
    add_webhook_commands(sub)

    _add_operator_commands(sub)
    add_analytics_command(sub)

    return parser


def _add_service_commands(sub: Any) -> None:
    """The long-running processes (the daemon, the console, the unsubscribe server),
    their set-up and probe, and the demo."""
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument(
        "--role",
        choices=["all", "dispatcher", "sender", "webhooks"],
        default="all",
        help="dispatcher: Redis → SQS; sender: SQS → SES; webhooks: deliveries; all: all (default)",
    )
    run.set_defaults(handler=cmd_run)

    console = sub.add_parser(
        "console",
        help="the operator's web console on FAIRPOST_CONSOLE_PORT (8025); needs FAIRPOST_CONSOLE_TOKEN",
        description="Serve the operator's web console: overview, tenants, jobs, dead letters; read-only "
        'unless FAIRPOST_CONSOLE_WRITE=true (docs/operations.md, "Console").',
    )
    console.set_defaults(handler=cmd_console)

    unsubscribe_server = sub.add_parser(
        "unsubscribe-server",
        help="the one-click unsubscribe endpoint (RFC 8058) on FAIRPOST_UNSUBSCRIBE__PORT (8026)",
        description="Serve /u/<token>: a GET shows a page, a POST with List-Unsubscribe=One-Click "
        "unsubscribes. Meant to face the internet; needs FAIRPOST_UNSUBSCRIBE__KEYS.",
    )
    unsubscribe_server.set_defaults(handler=cmd_unsubscribe_server)

    init = sub.add_parser(
        "init-aws", help="create the SQS FIFO queue (idempotent) and report differing attributes"
    )
    init.add_argument("--json", action="store_true")
    init.add_argument(
        "--events", action="store_true", help="also the SES events queue (FAIRPOST_EVENTS_QUEUE_NAME)"
    )
    init.add_argument(
        "--pool", default="default", help="the sending pool whose queue to create, in its account and region"
    )
    init.set_defaults(handler=cmd_init_aws)

    health = sub.add_parser(
        "health",
        help="exit 0 if this replica is alive, 1 if not (HTTP /healthz, or its heartbeat in Redis)",
    )
    health.add_argument("--json", action="store_true")
    health.add_argument("--replica", help="check this replica's heartbeat (default: this host's)")
    health.add_argument("--timeout", type=float, default=3.0)
    health.set_defaults(handler=cmd_health)

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


def _add_operator_commands(sub: Any) -> None:
    """What an operator checks and changes: the settings, the figures, tenants and pools."""
    check = sub.add_parser("check-config", help="validate and print the effective settings (secrets masked)")
    check.add_argument("--json", action="store_true")
    check.set_defaults(handler=cmd_check_config)
    add_doctor(sub)

    stats = sub.add_parser(
        "stats", help="per tenant and global: backlog, in flight, sent per window against the limit, pauses"
    )
    stats.add_argument("--json", action="store_true")
    stats.add_argument(
        "--watch", action="store_true", help="a live table (with --json: a JSON line per update)"
    )
    stats.add_argument("--interval", type=float, default=1.0, help="seconds between updates with --watch")
    stats.add_argument("--tenant", action="append", help="only these tenants (repeat for several)")
    stats.add_argument(
        "--pool",
        help="the sending pool to show (default: the one the --tenant are on, else the default pool)",
    )
    stats.set_defaults(handler=cmd_stats)

    add_quota_commands(sub)
    add_migrate_command(sub)
    add_unsubscribe_commands(sub)

    tenant_sub = add_tenant_parser(sub)  # with ``tenant warmup``
    add_pool_actions(tenant_sub)  # ``tenant move``, ``tenant pool``, ``tenant fallback``
    add_pools_command(sub)
    from fairpost.mailer.quota.holds import LIFTED_BY_RESUME

    resume_text = "let it send again at once: lifts " + "; ".join(
        f"{what} ({reason})" for reason, what in LIFTED_BY_RESUME.items()
    )
    for action, text in (("pause", "stop claiming and sending its mail"), ("resume", resume_text)):
        cmd = tenant_sub.add_parser(action, help=text, description=text)
        cmd.add_argument("tenant")
        cmd.add_argument(
            "--ses",
            action="store_true",
            help="also set its SES tenant's customer-managed sending status (DISABLED / ENABLED)",
        )
        cmd.set_defaults(handler=cmd_tenant_pause)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.demo import run_demo

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
        # A command about one tenant's state acts in the pool the tenant is on (#43).
        settings = tenant_pool_settings(args, settings)
        return handler(args, settings)
    except FairpostError as exc:
        print(f"fairpost: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        extra = _extra_providing(exc.name)
        if extra is None:
            raise
        if args.command in ("demo", "console"):
            extra = args.command  # which brings what it needs of the others
        # `pip install fairpost` is the SDK alone: say what to install, in one line.
        missing = (exc.name or "").split(".")[0]
        print(
            f"fairpost: `fairpost {args.command}` needs the {extra} extra ({missing} is not installed): "
            f"pip install 'fairpost[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fairpost ... | head`: the reader left; nothing to say.
        sys.stderr.close()
        return 0
    except Exception as exc:
        if _is_redis_error(exc):
            return unreachable_redis(settings, exc)
        code = aws_error(exc)
        if code is None:
            raise
        return code


# The top-level modules each extra brings (pyproject.toml's optional dependencies).
_EXTRA_MODULES = {
    "daemon": frozenset(
        {"boto3", "botocore", "aioboto3", "aiobotocore", "aiohttp", "prometheus_client", "rich"}
    ),
    "demo": frozenset({"matplotlib", "standardwebhooks"}),
    "console": frozenset({"jinja2"}),
}


def _extra_providing(module: str | None) -> str | None:
    root = (module or "").split(".")[0]
    return next((extra for extra, modules in _EXTRA_MODULES.items() if root in modules), None)


def _is_redis_error(exc: BaseException) -> bool:
    import redis

    return isinstance(exc, redis.RedisError)


if __name__ == "__main__":
    sys.exit(main())
