"""Where a delivered mail's Redis CPU goes, script by script: ``python -m bench.redis_profile``.

Starts the bench's services and one replica, drains ``--mails`` mails of 20
tenants (quotas not binding) and, during the drain only, has Redis log every
command it runs (``SLOWLOG`` with a threshold of 0: a script's own commands
are logged too, each just before the script's entry). It prints, per script,
the calls and the commands it ran per delivered mail and the microseconds
Redis spent in it per mail, and the same for commands sent on their own.

The microseconds are Redis's own timing of each command, with the slow log's
cost on top: read them as shares, not as the shard's capacity, which
``python -m bench --only scale`` measures without the log. The counts are
exact and do not depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.cluster import Backend, services, world
from bench.load import Load, wait_sent
from fairpost.dispatcher.calls import script
from fairpost.dispatcher.journal import append_source
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.quota.engine import quota_script
from fairpost.mailer.sdk.outcomes.deliveries import script as delivery_script
from fairpost.mailer.sdk.unsubscribes import unsubscribe_source

UNBOUND = {"global_limits": "100000/second", "tenant_limits": "100000/second"}
TENANTS = 20
_QUOTA_SCRIPTS = ("send_seq", "reputation", "recent_bounces", "hold", "warmup")
_DISPATCHER_HELPERS = ("ring", "journal", "append")
"""Prepended to other scripts (ring, journal), or loaded with one (append: journal.py)."""
_OUTCOME_SCRIPTS = ("claim", "fanout", "reap", "replay", "settle")


def script_sources() -> dict[str, tuple[str, str]]:
    """The SHA1 of every script as fairpost loads it -> (its file name, its source)."""
    sources: dict[str, tuple[str, str]] = {}

    def add(name: str, source: str) -> None:
        sources[hashlib.sha1(source.encode()).hexdigest()] = (name, source)

    for path in sorted((Path(__file__).resolve().parents[1] / "dispatcher").glob("*.lua")):
        if path.stem not in _DISPATCHER_HELPERS:
            add(f"dispatcher/{path.name}", script(path.stem))
    add("dispatcher/append.lua", append_source())
    for name in _QUOTA_SCRIPTS:
        add(f"mailer/quota/{name}.lua", lua_source("fairpost.mailer.quota", name))
    for name in ("acquire", "peek", "refund", "restamp", "usage"):
        add(f"mailer/quota/{name}.lua", quota_script(name))
    for name in ("send_claim", "heartbeat"):
        add(f"mailer/daemon/{name}.lua", lua_source("fairpost.mailer.daemon", name))
    add("mailer/sdk/rollups.lua", lua_source("fairpost.mailer.sdk", "rollups"))
    add("mailer/sdk/unsubscribe.lua", unsubscribe_source())
    for name in _OUTCOME_SCRIPTS:
        add(f"mailer/sdk/outcomes/{name}.lua", delivery_script(name))
    return sources


def script_names() -> dict[str, str]:
    """The SHA1 of every script as fairpost loads it -> its file name."""
    return {sha: name for sha, (name, _) in script_sources().items()}


@dataclass
class Usage:
    calls: int = 0
    usec: int = 0
    inner: Counter[str] = field(default_factory=Counter)


def attribute(entries: list[dict[str, Any]], names: dict[str, str]) -> dict[str, Usage]:
    """Slow log entries (newest first, as Redis returns them) -> usage per script or command.

    A script's own commands are logged with no client address (``?:0``), as
    they run, just before the script's own entry: Redis runs nothing else
    meanwhile."""
    usage: dict[str, Usage] = {}
    inner: Counter[str] = Counter()
    for entry in reversed(entries):
        words = _words(entry["command"])
        name = words[0].upper() if words else "?"
        if entry.get("client_address") in (b"?:0", "?:0"):
            inner[name] += 1
            continue
        if name in ("EVALSHA", "EVALSHA_RO") and len(words) > 1:
            name = names.get(words[1], f"script {words[1][:8]}")
        used = usage.setdefault(name, Usage())
        used.calls += 1
        used.usec += int(entry["duration"])
        used.inner.update(inner)
        inner = Counter()
    return usage


def _words(command: bytes | str) -> list[str]:
    text = command.decode(errors="replace") if isinstance(command, bytes) else command
    return text.split(" ")


async def drain(backend: Backend, mails: int) -> tuple[dict[str, Usage], float]:
    """Usage per script during a drain of ``mails``, and Redis CPU seconds it took (log on)."""
    names = script_names()
    with world(backend, "redis-profile", UNBOUND) as w:
        w.start_replicas(1)
        client = redis.Redis.from_url(w.config["redis_url"])
        try:
            client.config_set("slowlog-max-len", 2_000_000)
            async with Load(w.settings) as load:
                for n in range(TENANTS):
                    await load.burst(f"warm{n}", 5)
                if not await wait_sent(w.ses, 5 * TENANTS, within=60):
                    raise RuntimeError("the warm-up mails were not sent")
                client.slowlog_reset()
                client.config_set("slowlog-log-slower-than", 0)
                cpu0 = _cpu(client)
                for n in range(TENANTS):
                    await load.burst(f"d{n}", mails // TENANTS)
                if not await wait_sent(w.ses, 5 * TENANTS + mails, within=300):
                    raise RuntimeError("the mails were not all sent")
                client.config_set("slowlog-log-slower-than", 10_000)
                cpu = _cpu(client) - cpu0
                entries: list[dict[str, Any]] = client.slowlog_get(2_000_000)
        finally:
            client.close()
    return attribute(entries, names), cpu


def _cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def report(usage: dict[str, Usage], mails: int, cpu: float) -> str:
    lines = [
        f"{mails} mails of {TENANTS} tenants, 1 replica, enqueue included; "
        f"Redis CPU with the log on: {cpu * 1e6 / mails:.0f} µs per mail",
        f"{'script or command':34} {'calls/mail':>10} {'cmds/mail':>10} {'µs/mail':>8}  "
        "commands inside, per call",
    ]
    total_cmds = 0.0
    for name, u in sorted(usage.items(), key=lambda kv: -kv[1].usec):
        inner = sum(u.inner.values())
        cmds = (inner if inner else u.calls) / mails
        total_cmds += cmds
        top = ", ".join(f"{k} {v / u.calls:.1f}" for k, v in u.inner.most_common(6))
        lines.append(f"{name:34} {u.calls / mails:10.2f} {cmds:10.1f} {u.usec / mails:8.1f}  {top}")
    lines.append(f"{'all':34} {'':10} {total_cmds:10.1f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--mails", type=int, default=2000)
    args = parser.parse_args()
    with services("fairpost-rprof-") as backend:
        usage, cpu = asyncio.run(drain(backend, args.mails))
    print(report(usage, args.mails, cpu))


if __name__ == "__main__":
    main()
