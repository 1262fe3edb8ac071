"""The Redis commands fairpost runs, its ACL template, and the check that a user may run them.

:data:`COMMANDS` is the one list, derived from the code and the Lua scripts
(``redis.call`` in every ``.lua`` file, the redis-py calls of every module, and
what redis-py sends itself: the handshake, ``EVALSHA`` with ``SCRIPT LOAD`` on a
restarted server, ``MULTI``/``EXEC`` of a transaction pipeline, the cluster
client's topology questions). ``tests/ops/test_redis_acl.py`` runs fairpost
under a user built from :func:`acl_setuser` and checks that Redis counted no
other command. docs/operations.md, "Redis in production", prints the template.

:func:`denied_commands` asks Redis, as fairpost's own user, which of them it
may not run: Redis 7's ``redis.acl_check_cmd`` inside a script (an
application's user is seldom allowed ``ACL DRYRUN``), with the keys under
fairpost's prefix, so a key pattern that leaves them out shows too. The
commands a script cannot name (``MULTI``, ``WAIT``...) are run for real where
that is harmless (an empty transaction, ``WAIT 0 0``); the handshake and
``EVALSHA`` are proven by the check having run at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.exceptions

from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["COMMANDS", "AclCheck", "acl_setuser", "denied_commands"]

_K = "\0key"  # replaced by a key under fairpost's prefix in each probe

COMMANDS: dict[str, tuple[str, ...]] = {
    # The connection: redis-py's handshake (its CLIENT SETINFO, Redis 7.2 on, may be
    # refused: redis-py takes no answer as fine), and the checks of doctor and the daemon.
    "hello": ("3",),
    "auth": ("user", "password"),
    "select": ("0",),
    "ping": (),
    "info": ("memory",),
    "time": (),
    # Scripts (every Lua file) and transactions (pipelines with transaction=True).
    "evalsha": ("0" * 40, "1", _K),
    "script|load": ("return 1",),
    "script|exists": ("0" * 40,),
    "multi": (),
    "exec": (),
    # FAIRPOST_REDIS_MIN_REPLICAS: a write the product relies on ends with WAIT.
    "wait": ("0", "0"),
    # FAIRPOST_REDIS_CLUSTER: redis-py's cluster client reads the topology and the commands.
    "cluster|slots": (),
    "cluster|shards": (),
    "command": (),
    # The data: strings, hashes, lists, sets, sorted sets, the outcome stream.
    "get": (_K,), "set": (_K, "v"), "mget": (_K, _K), "mset": (_K, "v"), "incrby": (_K, "1"), "del": (_K,),
    "exists": (_K,), "copy": (_K, _K), "scan": ("0",),
    "expire": (_K, "1"), "pexpire": (_K, "1"), "persist": (_K,), "pttl": (_K,), "ttl": (_K,),
    "hget": (_K, "f"), "hmget": (_K, "f"), "hgetall": (_K,), "hkeys": (_K,), "hexists": (_K, "f"),
    "hset": (_K, "f", "v"), "hsetnx": (_K, "f", "v"), "hdel": (_K, "f"), "hincrby": (_K, "f", "1"),
    "lpush": (_K, "v"), "rpush": (_K, "v"), "rpop": (_K,), "lrange": (_K, "0", "1"), "llen": (_K,),
    "lrem": (_K, "0", "v"), "ltrim": (_K, "0", "1"), "lmove": (_K, _K, "LEFT", "RIGHT"),
    "lmpop": ("1", _K, "LEFT"), "blpop": (_K, "1"), "lpop": (_K, "1"),
    "sadd": (_K, "m"), "srem": (_K, "m"), "smembers": (_K,), "sismember": (_K, "m"), "scard": (_K,),
    "sscan": (_K, "0"), "sunionstore": (_K, _K),
    "zadd": (_K, "1", "m"), "zrem": (_K, "m"), "zscore": (_K, "m"), "zmscore": (_K, "m"),
    "zcard": (_K,), "zcount": (_K, "0", "1"), "zrange": (_K, "0", "1"),
    "zrangebyscore": (_K, "0", "1"), "zrevrange": (_K, "0", "1"), "zrevrangebyscore": (_K, "1", "0"),
    "zremrangebyscore": (_K, "0", "1"),
    "xadd": (_K, "*", "f", "v"), "xtrim": (_K, "MAXLEN", "1"), "xrange": (_K, "-", "+"),
    "xrevrange": (_K, "+", "-"), "xread": ("STREAMS", _K, "0"),
    "xreadgroup": ("GROUP", "g", "c", "STREAMS", _K, ">"), "xgroup|create": (_K, "g", "$"),
    "xack": (_K, "g", "0-1"), "xautoclaim": (_K, "g", "c", "0", "0-0"),
}  # fmt: skip
"""Every command fairpost runs, as Redis's ACL names it, with arguments to probe it by."""

_PROVEN_BY_CHECKING = frozenset({"hello", "auth", "select", "evalsha", "script|load"})
"""The check itself ran them: connecting (redis-py's handshake) and running its script."""

_TOPOLOGY_ONLY = {"cluster|slots": "cluster", "cluster|shards": "cluster", "command": "cluster"}
"""Commands only one topology needs."""


def acl_setuser(
    user: str = "fairpost", prefix: str = "fairpost", password: str = "PASSWORD", *, pools: Sequence[str] = ()
) -> str:
    """The ``ACL SETUSER`` line that allows fairpost exactly what it needs; ``pools``: the
    key prefixes of the sending pools besides the default (config/pools.py), each a pattern."""
    patterns = " ".join(f"~{MailKeys(p).root}*" for p in (prefix, *pools))
    allowed = " ".join("+" + name for name in COMMANDS)
    return f"ACL SETUSER {user} on >{password} resetkeys {patterns} resetchannels -@all {allowed}"


@dataclass(frozen=True)
class AclCheck:
    """What the user may not run (``denied``), and what could not be checked (``unchecked``)."""

    denied: tuple[str, ...]
    unchecked: tuple[str, ...]


def denied_commands(client: redis.Redis, prefix: str, *, cluster: bool) -> AclCheck:
    """Ask Redis which of :data:`COMMANDS` the client's user may not run. Raises
    ``NoPermissionError`` if it may not even run scripts, ``ResponseError`` on a
    Redis without ``redis.acl_check_cmd`` (before 7.0)."""
    key = f"{MailKeys(prefix).root}:doctor"
    wanted = {name: args for name, args in COMMANDS.items() if cluster or name not in _TOPOLOGY_ONLY}
    argv: list[str] = []
    for name, args in wanted.items():
        words = [*name.split("|"), *(key if arg == _K else arg for arg in args)]
        argv += [str(len(words)), *words]
    check = client.register_script(lua_source("fairpost.mailer.ops", "acl_check"))
    answers = check(keys=[key], args=argv)
    denied, unchecked = [], []
    for name, answer in zip(wanted, answers, strict=True):
        if answer == 0:
            denied.append(name)
        elif answer != 1 and name not in _PROVEN_BY_CHECKING and not _runs(client, name):
            unchecked.append(name)
    return AclCheck(tuple(denied), tuple(unchecked))


def _runs(client: redis.Redis, name: str) -> bool:
    """Run a command a script may not name, where that is harmless; False if not tried."""
    try:
        if name in ("multi", "exec"):
            client.pipeline(transaction=True).execute()  # an empty MULTI ... EXEC
        elif name == "wait":
            client.wait(0, 0)
        else:
            return False
    except redis.exceptions.NoPermissionError:
        return False
    return True
