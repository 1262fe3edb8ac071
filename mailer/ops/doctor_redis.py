"""``fairpost doctor``'s Redis checks: reach, version, topology, persistence, memory, ACL.

Each reads what any user may read (``INFO``, never ``CONFIG``, which managed
services refuse) through the client the daemon would build
(:mod:`fairpost.dispatcher.connect`: one server, Sentinel's master or the cluster
master of fairpost's slot, TLS as the URL says).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.exceptions

from fairpost.config import Settings, mask_url
from fairpost.config.pools import pool_key_prefix
from fairpost.dispatcher import connect
from fairpost.dispatcher.access import ACL_DOCS, access_denied
from fairpost.dispatcher.redis_memory import judge_policy, read_masters
from fairpost.mailer.ops.doctor_check import Check, Verdict
from fairpost.mailer.ops.redis_acl import acl_setuser, denied_commands
from fairpost.mailer.sdk.connection import timeouts

__all__ = ["MIN_VERSION", "redis_checks"]

MIN_VERSION = (7, 0)
"""fairpost's scripts use LMPOP and ZMSCORE (Redis 7.0; Valkey 7.2 and later report 7.2.4)."""

_LEVELS: dict[str, Verdict] = {"ok": "pass", "guarded": "warn", "refused": "fail"}
"""dispatcher/redis_memory.py's verdict on a policy, as a check's."""

_Step = Callable[[Settings, redis.Redis], Check]


def redis_checks(settings: Settings) -> list[Check]:
    client = connect.redis_client(settings, **timeouts(settings))
    try:
        reached = _reach(settings, client)
        if reached.verdict == "fail":
            return [reached]
        checks = [reached]
        steps: tuple[_Step, ...] = (_version, _topology, _persistence, _acl)
        for step in steps:
            checks.append(_guarded(step, settings, client))
        checks += _memory(settings)
        return checks
    finally:
        client.close()


def _check(name: str, verdict: Verdict, detail: str, fix: str = "") -> Check:
    return Check("redis", name, verdict, detail, fix)


def _guarded(step: _Step, settings: Settings, client: redis.Redis) -> Check:
    """A check that Redis cut short fails, saying what Redis answered."""
    try:
        return step(settings, client)
    except (redis.exceptions.RedisError, OSError) as exc:
        name = step.__name__.strip("_")
        return _check(name, "fail", f"Redis answered {type(exc).__name__}: {exc}", _reach_fix(settings))


def _reach_fix(settings: Settings) -> str:
    return (
        "check FAIRPOST_REDIS_URL (host, port, user and password; rediss:// for TLS, with "
        "FAIRPOST_REDIS_TLS_CA_FILE for a private CA) and that this host may reach Redis"
    )


def _reach(settings: Settings, client: redis.Redis) -> Check:
    url = mask_url(settings.redis_url)
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        denied = access_denied(exc, settings)
        if denied is not None:
            setting, rule = denied.problems[0]
            return _check("connection", "fail", f"{setting}: {rule}", f"fix {setting}")
        return _check("connection", "fail", f"cannot reach Redis at {url}: {exc}", _reach_fix(settings))
    tls = " over TLS" if urlsplit(settings.redis_url).scheme == "rediss" else ""
    return _check("connection", "pass", f"connected to {url}{tls} as user {_user(settings)}")


def _user(settings: Settings) -> str:
    if settings.redis_iam is not None:
        return settings.redis_iam.user
    return unquote(urlsplit(settings.redis_url).username or "") or "default"


def _version(settings: Settings, client: redis.Redis) -> Check:
    info: dict[str, Any] = client.info("server")
    version = str(info.get("redis_version", "0"))
    server = "Valkey " + str(info["valkey_version"]) if "valkey_version" in info else "Redis " + version
    have = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if have < MIN_VERSION:
        return _check(
            "version",
            "fail",
            f"{server}: fairpost needs Redis 7.0 or later (its scripts use LMPOP)",
            "upgrade the server (ElastiCache/MemoryDB: engine 7.0 or later; Valkey 7.2 or later)",
        )
    return _check("version", "pass", server)


def _topology(settings: Settings, client: redis.Redis) -> Check:
    replication: dict[str, Any] = client.info("replication")
    cluster = bool(int(client.info("cluster").get("cluster_enabled", 0)))
    role = str(replication.get("role", "master"))
    replicas = int(replication.get("connected_slaves", 0))
    wanted = settings.redis_min_replicas
    shape = "a cluster" if cluster else ("Sentinel's master" if settings.redis_sentinels else "one server")
    detail = f"{shape}, role {role}, {replicas} replica(s) connected, FAIRPOST_REDIS_MIN_REPLICAS={wanted}"
    if cluster != settings.redis_cluster:
        says = "is a cluster" if cluster else "is no cluster"
        return _check(
            "topology",
            "fail",
            f"Redis {says} but FAIRPOST_REDIS_CLUSTER={settings.redis_cluster}",
            f"set FAIRPOST_REDIS_CLUSTER={str(cluster).lower()}",
        )
    if role != "master":
        return _check(
            "topology",
            "fail",
            f"{detail}: fairpost writes, and a replica refuses writes",
            "point FAIRPOST_REDIS_URL at the primary (ElastiCache: its primary endpoint)",
        )
    if replicas < wanted:
        return _check(
            "topology",
            "fail",
            f"{detail}: writes the product relies on fail (NotReplicated)",
            "connect replicas, or lower FAIRPOST_REDIS_MIN_REPLICAS",
        )
    if replicas and not wanted:
        return _check(
            "topology",
            "warn",
            f"{detail}: a failover may lose the last writes",
            "set FAIRPOST_REDIS_MIN_REPLICAS=1",
        )
    return _check("topology", "pass", detail)


def _persistence(settings: Settings, client: redis.Redis) -> Check:
    info: dict[str, Any] = client.info("persistence")
    if int(info.get("aof_enabled", 0)):
        return _check("persistence", "pass", "append-only file on")
    last = "never saved" if not int(info.get("rdb_last_save_time", 0)) else "snapshots (RDB) only"
    return _check(
        "persistence",
        "warn",
        f"appendonly is off ({last}): a restart loses what was written since the last snapshot",
        "appendonly yes, appendfsync everysec (ElastiCache: Multi-AZ with replicas; MemoryDB is durable)",
    )


def _acl(settings: Settings, client: redis.Redis) -> Check:
    user = _user(settings)
    pools = [pool_key_prefix(settings, pool) for pool in settings.pools]
    template = f"{ACL_DOCS}; or: " + acl_setuser(user, settings.key_prefix, pools=pools)
    try:
        found = denied_commands(client, settings.key_prefix, cluster=settings.redis_cluster)
    except redis.exceptions.NoPermissionError as exc:
        return _check(
            "acl", "fail", f"user {user} may not run fairpost's scripts on its keys ({exc})", template
        )
    except redis.exceptions.ResponseError as exc:
        return _check("acl", "warn", f"the ACL of user {user} was not checked ({exc})", template)
    if found.denied:
        listed = " ".join("+" + name for name in found.denied)
        return _check(
            "acl",
            "fail",
            f"user {user} may not run: {', '.join(found.denied)}",
            f"ACL SETUSER {user} {listed} (the whole template: {template})",
        )
    if found.unchecked:
        return _check("acl", "warn", f"user {user}: not checked: {', '.join(found.unchecked)}", template)
    return _check(
        "acl", "pass", f"user {user} may run every command fairpost uses on {{{settings.key_prefix}}}*"
    )


# -- memory: dispatcher/redis_memory.py reads and judges it --------------------------


def _memory(settings: Settings) -> list[Check]:
    """The eviction policy, and how full each master is."""
    try:
        masters = read_masters(settings, **timeouts(settings))
    except (redis.exceptions.RedisError, OSError) as exc:
        return [_check("memory", "fail", f"INFO memory failed: {exc}", _reach_fix(settings))]
    checks = []
    high_water = settings.redis_high_water
    for memory in masters:
        where = f" on {memory.node}" if memory.node else ""
        verdict = judge_policy(memory, high_water)
        level = _LEVELS[verdict.level]
        checks.append(_check("policy", level, f"{verdict.reason}{where}", verdict.fix))
        used = f"{memory.used_memory / 2**20:.1f} MiB used"
        if not memory.limited:
            checks.append(
                _check(
                    "memory",
                    "warn",
                    f"{used}, no maxmemory{where}: Redis grows until the host runs out",
                    "set maxmemory, with room for the backlog you expect",
                )
            )
        elif memory.evicted_keys:
            checks.append(
                _check(
                    "memory",
                    "fail",
                    f"Redis evicted {memory.evicted_keys} keys{where} since "
                    "it started: fairpost may have lost mail",
                    "maxmemory-policy noeviction",
                )
            )
        elif memory.above(high_water):
            checks.append(
                _check(
                    "memory",
                    "warn",
                    f"{used} of {memory.maxmemory / 2**20:.1f} MiB "
                    f"({memory.fill:.0%}){where}: new mail is refused",
                    "more maxmemory",
                )
            )
        else:
            checks.append(
                _check(
                    "memory",
                    "pass",
                    f"{used} of {memory.maxmemory / 2**20:.1f} MiB ({memory.fill:.0%}){where}",
                )
            )
    return checks
