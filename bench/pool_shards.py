"""Sending pools on a Redis Cluster (#43): the shards carry more mail as pools are added.

Every key of a pool shares the pool's hash tag, so a pool is one slot, and on a
Redis Cluster the pools may sit on different masters. This bench starts a
3-master cluster (Debian's ``redis-server``, each master with one replica,
``redis-cli --cluster create``, as the HA tests start it), names pools whose hash
tags land on three different masters (asserted against ``CLUSTER SLOTS``, and
after each drain by the keys every master holds), and measures, in one run:

1. **One pool on one shard.** A ``fairpost run`` replica drains ``mails`` mails
   of :data:`TENANTS_PER_POOL` tenants of the default pool, enqueued through the
   SDK. Redis CPU (``INFO cpu``, ``used_cpu_sys`` + ``used_cpu_user``) of each
   master is read before the enqueue and after the last mail is recorded as
   sent; each master's idle CPU over as long (its rate in a quiet window just
   before) is taken off.
2. **Three pools on three shards.** The same with two more pools declared, the
   tenants placed over the three with the pool directory, ``mails`` mails a pool,
   a replica a pool. The two set-ups alternate :data:`REPEATS` times.

The figure is the mails a second the cluster carries per core of Redis: the
mails over the Redis CPU of its busiest master (a master is one thread: when
its core is full, the cluster is full), three pools against one. It is taken
in Redis core-seconds, not wall-clock seconds, because the replicas, the SQS
emulator and the recording SES share the machine's cores with Redis: on a
2-core machine the drain's wall-clock rate says how fast Python runs, not how
much a shard carries, and other load on the machine stretches the wall clock
far more than a command's CPU.

Each pool runs as the single-pool fairpost its
:func:`~fairpost.config.pools.pool_settings` describe (its key prefix, queue
and limits), with a client of its own slot, and the SDK's enqueue asks the
directory for each tenant's pool first, as ``MailClient.send`` does: at
78ea781 the pooled daemon and ``MailClient`` hold one connection pool, bound
to the default pool's slot, so that on a cluster a pool on another master
answers ``MOVED`` (BENCHMARKS.md, "Sending pools on a Redis Cluster").

3. **The SDK's routing.** Pairs of ``MailClient.send()`` of one mail, to the
   same tenant of the default pool, one by a client with the pools declared
   (each send asks the directory, cached
   :data:`~fairpost.mailer.sdk.directory.DIRECTORY_TTL` seconds), one by a client
   with none (it never reads the directory), which goes first alternating. The
   figure is what routing adds to a send's cost (client CPU, ``time.thread_time``
   around each call, plus Redis CPU): the routed client's CPU over the plain
   one's, and the Redis CPU of its directory reads (``INFO commandstats``
   counts them; no other command differs). Client CPU is paired send by send,
   because Redis CPU taken round by round moved by a fifth between identical
   rounds on this machine (the same commands, counted). Beside it, the
   directory's own answer from the cache and from Redis, each alone.

``python -m bench --only pools`` runs it within the bench (``--quick``: one
small drain of each); ``python -m bench.pool_shards [--mails N] [--repeats N]
[--enqueues N]`` alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.crc import key_slot

from bench.cluster import Backend, BenchError, World
from bench.figures import Figure
from bench.load import mail, wait_sent
from fairpost import MailClient
from fairpost.config import Settings
from fairpost.config.pools import DEFAULT_POOL, pool_names, pool_settings
from fairpost.dispatcher.connect import redis_client
from fairpost.dispatcher.keys import TOTAL_INFLIGHT
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.sdk.directory import DIRECTORY_TTL, PoolDirectory
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import ManagedProcess, free_port, start_fifo_sqs, start_redis
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for

MASTERS = 3
PREFIX = "bench-pools"
"""The default pool's key prefix (and hash tag); the others are ``<PREFIX>:pool:<name>``."""
TENANTS_PER_POOL = 4
UNBOUND = {"global_limits": "100000/second", "tenant_limits": "100000/second"}
SPEEDUP_TARGET = 2.5
ROUTING_TARGET = 5.0
"""Percent the SDK's routing may add to an enqueue's cost."""
IDLE_WINDOW = 2.0
"""Seconds each master's idle CPU is read over, before each drain."""
REPEATS = 2
"""Drains of each set-up, alternating: one pool, three pools, one pool, three pools."""
MAILS = 1_000
"""Mails a pool in each drain."""
ENQUEUES = 2_000
"""Pairs of sends of the routing figure."""
CHUNK = 50
"""Mails an SDK call in the drains' enqueue (``send_many``)."""


# -- the cluster ------------------------------------------------------------------------------


@dataclass
class RedisCluster:
    """A Redis Cluster this module started: every node, and the masters' ports."""

    nodes: list[tuple[ManagedProcess, int]]

    def masters(self) -> dict[tuple[int, int], int]:
        """Each master's slot range (first, last) -> its port, from ``CLUSTER SLOTS``."""
        with redis.Redis(port=self.nodes[0][1]) as client:
            rows = client.execute_command("CLUSTER SLOTS")
        return {(int(first), int(last)): int(master[1]) for first, last, master, *_ in rows}

    def master_of(self, slot: int) -> int:
        return next(port for (first, last), port in self.masters().items() if first <= slot <= last)

    def url_of(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0][1])

    def flush(self) -> None:
        for port in self.masters().values():
            with redis.Redis(port=port) as client:
                client.flushall()


def _ready(port: int) -> bool:
    """The node serves every slot, and as a master has its replica in sync (a first
    sync during a measured drain would be counted as the drain's CPU)."""
    try:
        with redis.Redis(port=port) as client:
            info = client.execute_command("CLUSTER INFO")
            replication: dict[str, Any] = client.info("replication")
    except redis.RedisError:
        return False
    if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
        return False
    replica = replication.get("slave0")
    if replication.get("role") == "master":
        return isinstance(replica, dict) and replica.get("state") == "online"
    return replication.get("master_link_status") == "up"


@contextlib.contextmanager
def redis_cluster(workdir: Path, masters: int = MASTERS) -> Iterator[RedisCluster]:
    """``masters`` masters, each with one replica, as the HA tests start them."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise BenchError("redis-cli is not installed (Debian: apt-get install redis-tools)")
    with contextlib.ExitStack() as stack:
        nodes = []
        for i in range(masters * 2):
            node_dir = workdir / f"node{i}"
            node_dir.mkdir()
            # The bus port is port + 10000 unless told: past 65535 for a high free port.
            proc, url = start_redis(
                node_dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(free_port()), "--repl-diskless-sync-delay", "0",
            )  # fmt: skip
            stack.callback(proc.stop)
            nodes.append((proc, int(urlsplit(url).port or 0)))
        created = subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{port}" for _, port in nodes],
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if created.returncode != 0:
            raise BenchError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
        wait_for(
            lambda: all(_ready(port) for _, port in nodes),
            within=30, what="every slot of the cluster served and replicated", interval=0.2,
        )  # fmt: skip
        yield RedisCluster(nodes)


# -- pools on shards --------------------------------------------------------------------------


def slot_of_prefix(prefix: str) -> int:
    """The slot of every key of the pool with this key prefix: its hash tag's."""
    return int(key_slot(MailKeys(prefix).ring().encode()))


def spread_pools(master_of: Callable[[int], int], prefix: str = PREFIX, count: int = MASTERS) -> list[str]:
    """The names of ``count - 1`` pools which, with the default pool on ``prefix``, have
    their hash tags on ``count`` different masters (``master_of``: slot -> master).
    Raises BenchError if the first hundred candidates do not do it."""
    taken = {master_of(slot_of_prefix(prefix))}
    names: list[str] = []
    for n in range(1, 100):
        name = f"p{n}"
        master = master_of(slot_of_prefix(f"{prefix}:pool:{name}"))
        if master not in taken:
            taken.add(master)
            names.append(name)
            if len(names) == count - 1:
                return names
    raise BenchError(f"no {count - 1} pool names put the pools on {count} masters")


def tenants_of(pools: Sequence[str]) -> dict[str, str]:
    """Each tenant -> its pool: :data:`TENANTS_PER_POOL` a pool (a pool named twice: twice as many)."""
    return {f"{pool}-t{i}": pool for i, pool in enumerate(p for p in pools for _ in range(TENANTS_PER_POOL))}


# -- Redis CPU --------------------------------------------------------------------------------


def cpu(ports: Sequence[int]) -> dict[int, float]:
    """Each server's Redis CPU seconds so far (``INFO cpu``: sys + user)."""
    out = {}
    for port in ports:
        with redis.Redis(port=port) as client:
            info: dict[str, Any] = client.info("cpu")
        out[port] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


def idle_rates(ports: Sequence[int], seconds: float = IDLE_WINDOW) -> dict[int, float]:
    """Each master's CPU seconds a second with nothing to do (cluster bus, replication pings, cron)."""
    before, t0 = cpu(ports), time.monotonic()
    time.sleep(seconds)  # a measuring window, not a wait for a condition
    after, elapsed = cpu(ports), time.monotonic() - t0
    return {port: max(0.0, (after[port] - before[port]) / elapsed) for port in ports}


@dataclass
class Drain:
    pools: int
    mails: int
    seconds: float
    """Wall clock of enqueue and drain (reported, never judged)."""
    busy: dict[int, float]
    """Each master's Redis CPU seconds over the drain, its idle CPU taken off."""
    idle: dict[int, float]
    """Each master's idle CPU seconds over as long, taken off."""
    keys: dict[int, int]
    """Keys on each master after the drain (DBSIZE): where the pools' keys sit."""

    @property
    def per_core(self) -> float:
        """Mails per core-second of the busiest master."""
        return self.mails / max(self.busy.values())

    def plus(self, other: Drain) -> Drain:
        """Two drains of the same pools as one (the keys: the later's)."""
        return Drain(
            self.pools, self.mails + other.mails, self.seconds + other.seconds,
            {p: v + other.busy[p] for p, v in self.busy.items()},
            {p: v + other.idle[p] for p, v in self.idle.items()}, other.keys,
        )  # fmt: skip


def _none_in_flight(conns: Mapping[str, redis.Redis], settings: Settings) -> bool:
    for name, conn in conns.items():
        keys = MailKeys(pool_settings(settings, name).key_prefix)
        if int(conn.hget(keys.counts(), TOTAL_INFLIGHT) or 0):
            return False
    return True


def pooled_settings(cluster: RedisCluster, pools: Mapping[str, Any], run: str) -> Settings:
    """What the application and the daemon share: the cluster, the default pool on
    :data:`PREFIX`, and ``pools`` declared (none: the single-pool set-up of today)."""
    return Settings.model_validate(
        {
            **UNBOUND,
            "redis_url": cluster.url_of(cluster.master_of(slot_of_prefix(PREFIX))),
            "redis_cluster": True,
            "key_prefix": PREFIX,
            "queue_name": f"{PREFIX}-{run}.fifo",
            "pools": {
                name: {**pool, "queue_name": f"{PREFIX}-{name}-{run}.fifo"} for name, pool in pools.items()
            },
            "shutdown_grace": 1,
        }
    )


def pool_world(
    backend: Backend, cluster: RedisCluster, settings: Settings, name: str, ses: SesServer
) -> World:
    """The pool as the daemon runs it (its :func:`pool_settings`), alone: one slot, one
    queue; the client of a replica is its slot's master's."""
    own = pool_settings(settings, name)
    config = {
        **UNBOUND,
        "redis_url": cluster.url_of(cluster.master_of(slot_of_prefix(own.key_prefix))),
        "redis_cluster": True,
        "key_prefix": own.key_prefix,
        "queue_name": own.queue_name,
        "shutdown_grace": 1,
    }
    w = World(backend, f"pools-{name}", config, ses)
    w.queue_url, _ = init_queue(backend.sqs(), w.settings)
    return w


async def drain(backend: Backend, cluster: RedisCluster, pools: Mapping[str, Any], per_pool: int) -> Drain:
    """A replica a pool drains ``per_pool`` mails of each pool (the default and
    ``pools``), enqueued through the SDK after the directory's answer; the masters'
    Redis CPU over it.

    Each pool runs as the single-pool fairpost its :func:`pool_settings` describe, with
    clients of its own slot: at 78ea781 the pooled daemon and ``MailClient`` hold one
    connection pool, to the default pool's slot, and on a Redis Cluster a pool on
    another master answers MOVED (BENCHMARKS.md, "Sending pools on a Redis Cluster")."""
    cluster.flush()
    masters = sorted(cluster.masters().values())
    settings = pooled_settings(cluster, pools, uuid.uuid4().hex[:6])
    names = pool_names(settings)
    tenants = tenants_of(names)
    each = per_pool // TENANTS_PER_POOL
    with contextlib.ExitStack() as stack:
        ses = stack.enter_context(SesServer())
        worlds = []
        for name in names:
            worlds.append(pool_world(backend, cluster, settings, name, ses))
            stack.callback(_tear_down, backend, worlds[-1])
        conns = {name: redis_client(pool_settings(settings, name)) for name in names}
        for conn in conns.values():
            stack.callback(conn.close)
        clients = {
            name: stack.enter_context(MailClient(pool_settings(settings, name), redis_client=c))
            for name, c in conns.items()
        }
        directory = PoolDirectory(settings, conns[DEFAULT_POOL])
        for tenant, pool in tenants.items():
            directory.place(tenant, pool)
        for w in worlds:
            w.start_replicas(1)
        idle = idle_rates(masters)
        before, t0 = cpu(masters), time.monotonic()
        sent = 0
        for chunk in range(0, each, CHUNK):
            for tenant in tenants:
                mails = [mail(sent + i) for i in range(min(CHUNK, each - chunk))]
                clients[directory.pool_of(tenant)].send_many(tenant, mails)
                sent += len(mails)
        if not await wait_sent(ses, sent, within=600):
            raise BenchError(f"{ses.sent_count} of {sent} mails sent:\n{worlds[0].replicas[0].log_tail()}")
        wait_for(lambda: _none_in_flight(conns, settings), within=60, what="every mail recorded as sent")
        after, elapsed = cpu(masters), time.monotonic() - t0
        keys = {port: _dbsize(port) for port in masters}
        errors = [line for w in worlds for line in w.replica_errors()]
        if errors:
            raise BenchError(f"a replica logged errors: {errors[0]}")
    spent = {port: idle[port] * elapsed for port in masters}
    busy = {port: max(1e-9, after[port] - before[port] - spent[port]) for port in masters}
    return Drain(len(names), sent, elapsed, busy, spent, keys)


def _dbsize(port: int) -> int:
    with redis.Redis(port=port) as client:
        return int(client.dbsize())


def _tear_down(backend: Backend, w: World) -> None:
    w.stop_replicas()
    with contextlib.suppress(Exception):
        backend.sqs().delete_queue(QueueUrl=w.queue_url)


# -- the SDK's routing ------------------------------------------------------------------------


@dataclass
class Lookups:
    hit: float
    """Client CPU seconds of a directory answer from the cache."""
    miss_client: float
    """Client CPU seconds of an answer read from Redis (two HGETs, one round trip)."""
    miss_redis: float
    """Redis CPU seconds of it."""
    miss_wall: float


@dataclass
class Routing:
    """``sends`` pairs of ``send()``: one by a client with no pool declared (it never
    reads the directory), one by a client with the pools declared (each send asks
    the directory, cached), to the same tenant, one after the other."""

    sends: int
    plain_client: float
    """Client CPU seconds of the plain client's sends."""
    routed_client: float
    redis: float
    """Redis CPU seconds of both clients' sends (the default pool's master)."""
    reads: int
    """Directory reads from Redis the routed client made (its cache's misses)."""
    wall: float
    lookups: Lookups

    @property
    def plain_cost(self) -> float:
        """Client and Redis CPU seconds of a plain send (Redis's: half of the pairs')."""
        return (self.plain_client + self.redis / 2) / self.sends

    @property
    def extra(self) -> float:
        """Percent routing adds to a send: the client's CPU over the plain client's,
        and the Redis CPU of the directory reads (no other command differs)."""
        added = self.routed_client - self.plain_client + self.reads * self.lookups.miss_redis
        return added / self.sends / self.plain_cost * 100


def routing(cluster: RedisCluster, pools: Mapping[str, Any], sends: int) -> Routing:
    """Pairs of sends by a plain and a routed client, round-robin over tenants of the
    default pool (the routed client reaches no other pool's master at 78ea781, see
    :func:`drain`), which of the two goes first alternating; each client's CPU
    summed apart (``time.thread_time`` around each call), so that both see the same
    moments of the machine. Both send the same commands to the same master, but
    for the directory reads, which ``INFO commandstats`` counts: the plain client
    sends no ``HGET`` (checked)."""
    run = uuid.uuid4().hex[:6]
    plain_settings = pooled_settings(cluster, {}, run)
    routed_settings = pooled_settings(cluster, pools, run)
    tenants = list(tenants_of([DEFAULT_POOL] * MASTERS))
    port = cluster.master_of(slot_of_prefix(PREFIX))
    cluster.flush()
    with (
        MailClient(plain_settings) as plain,
        MailClient(routed_settings) as routed,
        redis.Redis(port=port) as master,
    ):
        for client in (plain, routed):  # connections made, caches filled: not counted
            for tenant in tenants:
                _send(client, tenant)
        master.config_resetstat()
        for tenant in tenants:
            _send(plain, tenant)
        if _hgets(master):
            raise BenchError("a send with no pool declared reads HGET: the directory reads are not counted")
        spent = {id(plain): 0.0, id(routed): 0.0}
        master.config_resetstat()
        before, w0 = cpu([port])[port], time.monotonic()
        for n in range(sends):
            for client in (plain, routed) if n % 2 == 0 else (routed, plain):
                t0 = time.thread_time()
                _send(client, tenants[n % len(tenants)])
                spent[id(client)] += time.thread_time() - t0
        redis_cpu, wall = cpu([port])[port] - before, time.monotonic() - w0
        reads = _hgets(master) // 2
    directory = lookups(cluster, routed_settings, tenants, sends)
    return Routing(sends, spent[id(plain)], spent[id(routed)], redis_cpu, reads, wall, directory)


def _hgets(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_hget", {}).get("calls", 0))


def _send(client: MailClient, tenant: str) -> None:
    client.send(
        tenant, sender="app@bench.example", to=["user@example.org"], subject="bench", text="A mail.\n"
    )


def lookups(cluster: RedisCluster, settings: Settings, tenants: Sequence[str], count: int) -> Lookups:
    """What the directory costs alone: ``count`` answers from the cache, and ``count``
    read from Redis (a cache that keeps nothing)."""
    port = cluster.master_of(slot_of_prefix(settings.key_prefix))
    with contextlib.closing(redis_client(settings)) as conn:
        cached, uncached = PoolDirectory(settings, conn), PoolDirectory(settings, conn, ttl=0.0)
        for tenant in tenants:
            cached.pool_of(tenant)
        t0 = time.thread_time()
        for n in range(count):
            cached.pool_of(tenants[n % len(tenants)])
        hit = (time.thread_time() - t0) / count
        before, t0, w0 = cpu([port])[port], time.thread_time(), time.monotonic()
        for n in range(count):
            uncached.pool_of(tenants[n % len(tenants)])
        client, wall, redis_cpu = time.thread_time() - t0, time.monotonic() - w0, cpu([port])[port] - before
    return Lookups(hit, client / count, redis_cpu / count, wall / count)


# -- the figures ------------------------------------------------------------------------------


def figures(one: Drain, three: Drain, placed: Mapping[str, int], routes: Routing) -> list[Figure]:
    speedup = three.per_core / one.per_core
    shards = ", ".join(f"{pool} on :{port}" for pool, port in placed.items())

    def cpu_text(d: Drain) -> str:
        return ", ".join(f":{p} {d.busy[p] * 1e3:.0f} ms (idle {d.idle[p] * 1e3:.0f} ms off)" for p in d.busy)

    def keys_text(d: Drain) -> str:
        return ", ".join(f":{p} {n}" for p, n in d.keys.items())

    directory, base = routes.lookups, routes.plain_cost
    miss = directory.miss_client + directory.miss_redis
    return [
        Figure(
            key="pools_shard_speedup",
            title="Pools: mails per Redis core-second, 3 pools on 3 shards over 1 pool on 1 shard",
            value=speedup,
            unit="x",
            op=">=",
            target=SPEEDUP_TARGET,
            detail=(
                f"a {MASTERS}-master Redis Cluster (each master with a replica), pools {shards} "
                f"(hash tags on 3 masters, CLUSTER SLOTS); one replica drains, enqueue included; "
                f"1 pool: {one.mails} mails, busiest master {max(one.busy.values()) * 1000:.0f} ms of Redis "
                f"CPU ({cpu_text(one)}), {one.per_core:,.0f} mails per core-second, {one.seconds:.1f} s "
                f"wall; 3 pools: {three.mails} mails, busiest master {max(three.busy.values()) * 1000:.0f} "
                f"ms ({cpu_text(three)}), {three.per_core:,.0f} mails per core-second, "
                f"{three.seconds:.1f} s wall; keys on each master after: 1 pool {keys_text(one)}, "
                f"3 pools {keys_text(three)}"
            ),
            data={"one": one.__dict__, "three": three.__dict__, "placed": dict(placed)},
        ),
        Figure(
            key="pools_routing_cost",
            title="Pools: what the SDK's routing adds to an enqueue's cost (client + Redis CPU)",
            value=routes.extra,
            unit=" %",
            op="<=",
            target=ROUTING_TARGET,
            detail=(
                f"{routes.sends} pairs of send() of one mail, round-robin over {TENANTS_PER_POOL * MASTERS} "
                f"tenants of the default pool, by a client with no pool declared and one with 3 pools "
                f"(the directory asked, cached {DIRECTORY_TTL:.0f} s), in turn: client CPU "
                f"{routes.plain_client / routes.sends * 1e6:.0f} µs a send plain, "
                f"{routes.routed_client / routes.sends * 1e6:.0f} µs routed; Redis CPU "
                f"{routes.redis / routes.sends / 2 * 1e6:.0f} µs a send, the same commands but for "
                f"{routes.reads} directory reads ({directory.miss_redis * 1e6:.0f} µs of Redis CPU each); "
                f"{routes.wall / routes.sends / 2 * 1e6:.0f} µs wall a send. The directory alone: "
                f"{directory.hit * 1e6:.1f} µs of client CPU an answer from the cache "
                f"({directory.hit / base * 100:.2f} % of a send); "
                f"{miss * 1e6:.0f} µs of client and Redis CPU an answer read from Redis "
                f"({miss / base * 100:.0f} % of a send, {directory.miss_wall * 1e6:.0f} µs wall), which a "
                f"tenant's first send each {DIRECTORY_TTL:.0f} s pays"
            ),
        ),
    ]


async def measure(backend: Backend, mails: int, enqueues: int, repeats: int = REPEATS) -> list[Figure]:
    """The figures, on a cluster of their own; ``mails`` a pool in each drain, ``repeats``
    drains of each set-up, ``enqueues`` sends a round of the routing figure."""
    with tempfile.TemporaryDirectory(prefix="fairpost-pools-") as tmp, redis_cluster(Path(tmp)) as cluster:
        names = spread_pools(cluster.master_of)
        placed = {DEFAULT_POOL: cluster.master_of(slot_of_prefix(PREFIX))}
        placed |= {name: cluster.master_of(slot_of_prefix(f"{PREFIX}:pool:{name}")) for name in names}
        if len(set(placed.values())) != MASTERS:
            raise BenchError(f"the pools are not on {MASTERS} masters: {placed}")
        pools: dict[str, Any] = {name: {} for name in names}
        one = three = None
        for _ in range(repeats):  # alternating, so that the machine's load drifts alike over both
            once = await drain(backend, cluster, {}, mails)
            one = once if one is None else one.plus(once)
            thrice = await drain(backend, cluster, pools, mails)
            # The pools' keys sit on different shards: every master holds some after the drain.
            if not all(thrice.keys.values()):
                raise BenchError(f"the pools' keys are not on {MASTERS} masters: {thrice.keys}")
            three = thrice if three is None else three.plus(thrice)
        assert one is not None and three is not None
        routes = routing(cluster, pools, enqueues)
    return figures(one, three, placed, routes)


async def run(backend: Backend, quick: bool) -> list[Figure]:
    if quick:
        return await measure(backend, 200, 200, 1)
    return await measure(backend, MAILS, ENQUEUES, REPEATS)


def main() -> None:
    description = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.pool_shards", description=description)
    parser.add_argument("--mails", type=int, default=MAILS, help="mails a pool in each drain")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="drains of each set-up, alternating")
    parser.add_argument("--enqueues", type=int, default=ENQUEUES, help="pairs of sends of the routing figure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fairpost-pools-") as workdir:
        process, sqs_url = start_fifo_sqs(Path(workdir))
        try:
            backend = Backend(redis_port=0, sqs_url=sqs_url, workdir=Path(workdir))
            got = asyncio.run(measure(backend, args.mails, args.enqueues, args.repeats))
        finally:
            process.stop()
    for figure in got:
        print(f"{figure.title}: {figure.value_text()} ({figure.verdict}) {figure.detail}")


if __name__ == "__main__":
    main()
