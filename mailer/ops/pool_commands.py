"""``fairpost tenant move|pool|fallback`` and ``fairpost pools``: tenants on sending pools
(#43; docs/operations.md, "Sending pools")."""

from __future__ import annotations

import argparse
from typing import Any

from fairpost.config import ConfigError, Settings
from fairpost.config.pools import pool_names, pool_settings
from fairpost.mailer.ops.console import fail, print_json, unreachable_redis

__all__ = ["add_parser", "add_tenant_actions", "tenant_pool_settings"]

_TENANT_STATE = frozenset({"quota", "analytics"})
"""Commands about a tenant's state in its pool's keys (its overrides, its counts)."""
_TENANT_STATE_ACTIONS = frozenset({"pause", "resume", "warmup"})
"""``fairpost tenant`` actions about its state there (not ``move``, ``pool``, ``fallback``)."""


def tenant_pool_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """For a command about one tenant's state (its quota, pause, warm-up, counts), the
    settings of the pool the tenant is on: its keys and, on a Redis Cluster, its slot.
    Any other command, or an installation without pools: the settings as they are."""
    in_pool = getattr(args, "in_pool", None)  # --pool: the command acts in that pool
    if in_pool is not None:
        if in_pool not in pool_names(settings):
            raise ConfigError([("--pool", f"no pool {in_pool!r}: one of {', '.join(pool_names(settings))}")])
        return pool_settings(settings, in_pool)
    command = getattr(args, "command", None)
    scoped = command in _TENANT_STATE or (command == "tenant" and args.action in _TENANT_STATE_ACTIONS)
    tenant = getattr(args, "tenant", None)
    if command == "quota" and getattr(args, "values", None) and len(args.values) > 1:
        tenant = args.values[0]  # quota set TENANT LIMITS
    if not settings.pools or not scoped or not isinstance(tenant, str):
        return settings
    from fairpost.mailer.sdk.pool_admin import Pools

    with Pools(settings) as pools:
        return pool_settings(settings, pools.pool_of(tenant))


def add_tenant_actions(actions: Any) -> None:
    """``tenant move``, ``tenant pool`` and ``tenant fallback``, beside the tenant's other actions."""
    move = actions.add_parser(
        "move",
        help="send the tenant's new mail through another pool; its waiting mail drains where it is",
        description="Move a tenant to another sending pool: its limits, pause, hold, warm-up step, "
        "suppression list and idempotency keys come along, its reputation stays. New mail goes to "
        "the new pool within seconds; mail already waiting is sent from the old pool. Resumable: "
        "run it again after a kill, or to finish once the old pool has drained.",
    )
    move.add_argument("tenant")
    move.add_argument("--to", required=True, metavar="POOL")
    move.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="wait this long for the old pool to drain"
    )
    move.add_argument("--json", action="store_true")
    move.set_defaults(handler=cmd_tenant_move)
    show = actions.add_parser("pool", help="show the tenant's pool, its fallback and any move in progress")
    show.add_argument("tenant")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_tenant_pool)
    fallback = actions.add_parser(
        "fallback",
        help="let the tenant's new mail go through POOL while its own pool's SES fails (opt-in)",
        description="Name the pool the tenant's new mail may go through while its own pool's SES "
        "fails; its identities must exist in that pool's SES (checked with GetEmailIdentity; "
        "--skip-identity-check sets it unchecked).",
    )
    fallback.add_argument("tenant")
    target = fallback.add_mutually_exclusive_group(required=True)
    target.add_argument("--to", metavar="POOL")
    target.add_argument("--none", action="store_true", help="no fallback: its mail waits for its own pool")
    fallback.add_argument(
        "--skip-identity-check",
        action="store_true",
        help="set it without asking the fallback pool's SES (you checked its identities yourself)",
    )
    fallback.add_argument("--json", action="store_true")
    fallback.set_defaults(handler=cmd_tenant_fallback)


def add_parser(sub: Any) -> None:
    pools = sub.add_parser("pools", help="the sending pools and the tenants not on the default pool")
    pools.add_argument("--json", action="store_true")
    pools.set_defaults(handler=cmd_pools)


def cmd_tenant_move(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.sdk.pool_admin import Pools

    try:
        with Pools(settings) as pools:
            report = pools.move(args.tenant, args.to, wait=args.wait)
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    if args.json:
        print_json(report.to_json())
    elif report.step == "done" and report.source == report.target:
        print(f"tenant {report.tenant} is on pool {report.target}")
    elif report.step == "done":
        print(f"tenant {report.tenant} moved from {report.source} to {report.target}")
    else:
        print(f"tenant {report.tenant}: new mail goes to {report.target}; {report.waiting} jobs still "
              f"drain from {report.source} (run the move again to finish)")  # fmt: skip
    return 0


def cmd_tenant_pool(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.sdk.pool_admin import Pools

    try:
        with Pools(settings) as pools:
            placement, move = pools.placement(args.tenant), pools.moving(args.tenant)
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    if args.json:
        print_json({"tenant": args.tenant, "pool": placement.pool, "fallback": placement.fallback,
                    "fallback_identities": placement.fallback_identities if placement.fallback else None,
                    "move": None if move is None else move.to_json()})  # fmt: skip
        return 0
    fallback = f"{placement.fallback} ({placement.fallback_identities})" if placement.fallback else "none"
    print(f"tenant {args.tenant}: pool {placement.pool}; fallback {fallback}")
    if move is not None:
        print(
            f"  moving from {move.source} to {move.target}: {move.step}, {move.waiting} jobs in {move.source}"
        )
    return 0


def cmd_tenant_fallback(args: argparse.Namespace, settings: Settings) -> int:
    import redis

    from fairpost.mailer.sdk.pool_admin import Pools

    target: str | None = None if args.none else args.to
    checked = target is not None and not args.skip_identity_check
    if target is not None and target not in pool_names(settings):
        return fail(f"no pool {target!r}: one of {', '.join(pool_names(settings))}")
    if checked and (refused := _identities_refused(settings, target or "", args.tenant)):
        return fail(refused)
    try:
        with Pools(settings) as pools:
            pools.set_fallback(args.tenant, target, identities_checked=checked)
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    if args.json:
        print_json({"tenant": args.tenant, "fallback": target, "identities_checked": checked})
    else:
        unchecked = (
            " (its identities there not checked: followed once the daemon finds them there)"
            if target and not checked
            else ""
        )
        print(f"tenant {args.tenant}: fallback {target or 'none'}{unchecked}")
    return 0


def _identities_refused(settings: Settings, pool: str, tenant: str) -> str | None:
    """Why the tenant may not fall back to ``pool`` (its identities missing from the pool's
    SES, or SES not answering), naming the identities; None if it may."""
    from fairpost.mailer.errors import SesUnanswered
    from fairpost.mailer.ops.pool_identities import missing_identities

    skip = (
        f"--skip-identity-check sets it anyway (tenant fallback {tenant} --to {pool} --skip-identity-check)"
    )
    try:
        missing = missing_identities(settings, pool, tenant)
    except SesUnanswered as exc:
        return f"{exc}: cannot check tenant {tenant}'s identities there; {skip}"
    if missing:
        return (f"tenant {tenant}'s identities do not exist in pool {pool}'s SES: {', '.join(missing)} "
                f"(verify them there first, or {skip})")  # fmt: skip
    return None


def cmd_pools(args: argparse.Namespace, settings: Settings) -> int:
    import redis
    from redis.crc import key_slot

    from fairpost.config.pools import pool_key_prefix
    from fairpost.mailer.sdk.keys import MailKeys
    from fairpost.mailer.sdk.pool_admin import Pools

    try:
        with Pools(settings) as pools:
            placed = pools.placements() if settings.pools else {}
            failing = pools.directory.failing() if settings.pools else {}
    except (redis.RedisError, OSError) as exc:
        return unreachable_redis(settings, exc)
    rows: list[dict[str, Any]] = [
        {"pool": name, "key_prefix": pool_key_prefix(settings, name), "failing_since_ms": failing.get(name),
         "slot": key_slot(MailKeys(pool_key_prefix(settings, name)).root.encode()),
         "tenants": sorted(t for t, p in placed.items() if p == name)}
        for name in pool_names(settings)
    ]  # fmt: skip
    if args.json:
        print_json({"pools": rows})
        return 0
    for row in rows:
        tenants = (
            "every tenant not placed elsewhere" if row["pool"] == "default" else ", ".join(row["tenants"])
        )
        print(f"{row['pool']:12} {{{row['key_prefix']}}} slot {row['slot']:<5}  {tenants or '(no tenants)'}")
        if row["failing_since_ms"] is not None:
            print(f"{'':12} SES failing since {row['failing_since_ms']} ms: tenants with a fallback use it")
    return 0
