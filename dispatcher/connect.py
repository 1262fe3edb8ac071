"""Redis clients for every topology, chosen by the settings: the one place a client is built.

- ``FAIRPOST_REDIS_URL`` alone: one server.
- ``FAIRPOST_REDIS_SENTINELS`` + ``FAIRPOST_REDIS_SENTINEL_MASTER``: the master is
  asked of Sentinel on every new connection, so a failover is followed (redis-py's
  Sentinel pool; a demoted master's ``READONLY`` answer drops the connection).
- ``FAIRPOST_REDIS_CLUSTER=true``: a redis-py cluster client (``RedisCluster``)
  follows the topology from any node, and the connections go to the master of
  the one slot all of fairpost's keys hash to (they share the ``{prefix}`` tag).

Both replicated topologies hand back a plain ``Redis`` whose connection pool
finds the master, in the way redis-py's ``Sentinel.master_for`` does: scripts,
pipelines of scripts (which redis-py's cluster pipeline refuses), ``MULTI``,
``BLPOP``, ``TIME`` and ``WAIT`` all go to the node that holds fairpost's data,
and the rest of the code needs no cluster-specific path. A ``MOVED`` or
``CLUSTERDOWN`` answer (the slot changed hands, a failover under way) drops the
connection and is raised as a ``ConnectionError``: the command did not run, and
the next connection asks the cluster again.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.asyncio.sentinel
import redis.cluster
import redis.connection
import redis.sentinel
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, ConnectionError, TryAgainError

from fairpost.config import Settings
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.packing import hiredis_packing

__all__ = ["async_redis_client", "node_options", "redis_client", "slot_of"]

# Answers that mean "not here (now)": the command did not run.
_ELSEWHERE = (AskError, ClusterDownError, TryAgainError)

# redis-py 6 split connecting from the health check (``connect_check_health``); the
# SDK's floor, 5.0.1, has only ``connect``. Both are served.
CONNECT_CHECKS_HEALTH = hasattr(redis.connection.AbstractConnection, "connect_check_health")


def slot_of(settings: Settings) -> int:
    """The cluster slot of every fairpost key (they share the ``{prefix}`` hash tag)."""
    return key_slot(Keys(settings.key_prefix).root.encode())


SOCKET_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 15.0,
    "socket_keepalive": True,
}
"""A master that vanished without closing its connections (a host down, a network cut)
must fail the calls waiting on it within seconds, not when TCP gives up, so that the
failover is noticed. No fairpost command blocks longer (BLPOP waits at most about 1 s)."""


def redis_client(settings: Settings, **options: Any) -> redis.Redis:
    """A blocking client for the topology the settings name (``options``: socket timeouts...)."""
    options = {**SOCKET_DEFAULTS, **options}
    if settings.redis_cluster:
        return redis.Redis.from_pool(_SyncSlotPool(settings, **options))
    if settings.redis_sentinels:
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            _sentinel_addresses(settings),
            sentinel_kwargs=_sentinel_kwargs(settings, options),
            **_node_kwargs(settings),
            **options,
        )
        master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            _master_name(settings), connection_pool_class=_SyncSentinelPool
        )
        return master
    connection = _connection_class(settings, redis.connection.SSLConnection)
    return redis.Redis.from_url(settings.redis_url, **node_options(settings), **connection, **options)


def async_redis_client(settings: Settings, **options: Any) -> redis.asyncio.Redis:
    """An asyncio client for the topology the settings name, packing its commands
    with hiredis where it is installed (fairpost.dispatcher.packing)."""
    return hiredis_packing(_async_client(settings, **options))


def _async_client(settings: Settings, **options: Any) -> redis.asyncio.Redis:
    options = {**SOCKET_DEFAULTS, **options}
    if settings.redis_cluster:
        return redis.asyncio.Redis.from_pool(_AsyncSlotPool(settings, **options))
    if settings.redis_sentinels:
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            _sentinel_addresses(settings),
            sentinel_kwargs=_sentinel_kwargs(settings, options),
            **_node_kwargs(settings),
            **options,
        )
        async_master: redis.asyncio.Redis = sentinel.master_for(
            _master_name(settings), connection_pool_class=_AsyncSentinelPool
        )
        return async_master
    connection = _connection_class(settings, redis.asyncio.connection.SSLConnection, asyncio_class=True)
    if not connection:
        return redis.asyncio.Redis.from_url(settings.redis_url, **node_options(settings), **options)
    # redis-py's asyncio from_url puts the URL's connection class over the one given.
    kwargs: dict[str, Any] = dict(redis.asyncio.connection.parse_url(settings.redis_url))
    kwargs.update({**node_options(settings), **options, **connection})
    return redis.asyncio.Redis.from_pool(redis.asyncio.ConnectionPool(**kwargs))


# -- settings to redis-py arguments ---------------------------------------------


def node_options(settings: Settings) -> dict[str, Any]:
    """What every connection to a data node takes beside the URL (a cluster client's
    too): the CA file of ``FAIRPOST_REDIS_TLS_CA_FILE`` and, with IAM, the token
    provider (fairpost.dispatcher.iam: a token minted per connection)."""
    extra: dict[str, Any] = {}
    if settings.redis_tls_ca_file is not None and urlsplit(settings.redis_url).scheme == "rediss":
        extra["ssl_ca_certs"] = str(settings.redis_tls_ca_file)
    if settings.redis_iam is not None:
        from fairpost.dispatcher.iam import token_provider

        extra["credential_provider"] = token_provider(settings.redis_iam)
    return extra


def _connection_class(settings: Settings, base: type[Any], *, asyncio_class: bool = False) -> dict[str, Any]:
    """With IAM, connections renew themselves before the service cuts them (12 hours)."""
    if settings.redis_iam is None:
        return {}
    from fairpost.dispatcher.iam import renewing

    age = settings.redis_iam.max_connection_age
    return {"connection_class": renewing(base, age, asyncio_class=asyncio_class)}


def _node_kwargs(settings: Settings) -> dict[str, Any]:
    """What ``FAIRPOST_REDIS_URL`` says of the data nodes beside their address:
    credentials, database, TLS (``rediss://``) and any query options."""
    kwargs: dict[str, Any] = redis.connection.parse_url(settings.redis_url)  # type: ignore[no-untyped-call]
    kwargs.update(node_options(settings))
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    if kwargs.pop("connection_class", None) is redis.connection.SSLConnection:
        kwargs["ssl"] = True
    return kwargs


def _sentinel_addresses(settings: Settings) -> list[tuple[str, int]]:
    addresses = settings.sentinel_addresses()
    assert addresses, "settings validation guarantees sentinels here"
    return addresses


def _master_name(settings: Settings) -> str:
    assert settings.redis_sentinel_master is not None
    return settings.redis_sentinel_master


def _sentinel_kwargs(settings: Settings, options: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(options)
    if settings.redis_sentinel_password is not None:
        kwargs["password"] = settings.redis_sentinel_password.get_secret_value()
    if settings.redis_sentinel_tls:
        kwargs["ssl"] = True
        if settings.redis_tls_ca_file is not None:
            kwargs["ssl_ca_certs"] = str(settings.redis_tls_ca_file)
    return kwargs


# -- Sentinel: redis-py's pools, closing the sentinel connections with the client ---


class _SyncSentinelPool(redis.sentinel.SentinelConnectionPool):
    # ``disconnect``, not ``close``: redis-py 5's client closes its pool with it. The
    # pool itself drops only idle connections (inuse_connections=False) on a failover.
    def disconnect(self, inuse_connections: bool = True) -> None:
        super().disconnect(inuse_connections)
        if not inuse_connections:
            return
        for sentinel in self.sentinel_manager.sentinels:
            sentinel.close()


class _AsyncSentinelPool(redis.asyncio.sentinel.SentinelConnectionPool):
    # ``disconnect``, not ``aclose``: redis-py 5's client closes its pool with it. The
    # pool itself drops only idle connections (inuse_connections=False) on a failover.
    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if not inuse_connections:
            return
        for sentinel in self.sentinel_manager.sentinels:
            await sentinel.aclose()


# -- Cluster: connections to the master of fairpost's slot ------------------------


def _cluster_kwargs(settings: Settings, options: dict[str, Any]) -> dict[str, Any]:
    kwargs = _node_kwargs(settings)
    kwargs.pop("db", None)  # a cluster has only database 0 (settings check it)
    kwargs.update(options)
    return kwargs


def _shared(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Of a pool's connection arguments, those its cluster client needs too."""
    return {name: kwargs[name] for name in ("ssl_ca_certs", "credential_provider") if name in kwargs}


def _moved_to_connection_error(exc: Exception) -> ConnectionError:
    return ConnectionError(f"fairpost's slot is not served here now ({type(exc).__name__}: {exc})")


class _SyncSlotConnection(redis.connection.Connection):
    def __init__(self, **kwargs: Any) -> None:
        self.slot_pool: _SyncSlotPool = kwargs.pop("slot_pool")
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def connect(self) -> None:
        self.retry.call_with_retry(self._connect_to_slot_master, lambda error: None)

    def _connect_to_slot_master(self) -> None:
        if self._sock:
            return
        self.host, self.port = self.slot_pool.slot_master()
        if CONNECT_CHECKS_HEALTH:
            self.connect_check_health(check_health=False, retry_socket_connect=False)
        else:  # redis-py 5: its own connect, which retries the socket itself
            super().connect()  # type: ignore[no-untyped-call]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except _ELSEWHERE as exc:
            self.disconnect()  # type: ignore[no-untyped-call]
            raise _moved_to_connection_error(exc) from exc


class _SyncSlotSSLConnection(_SyncSlotConnection, redis.connection.SSLConnection):
    pass


class _SyncSlotPool(redis.ConnectionPool):
    """Connections to whichever node is master of fairpost's slot, asked of the cluster."""

    def __init__(self, settings: Settings, **options: Any) -> None:
        kwargs = _cluster_kwargs(settings, options)
        ssl = kwargs.pop("ssl", False)
        # The cluster client reads the URL itself; the token provider is this pool's.
        self._cluster_options = {**options, **_shared(kwargs)}
        self._url = settings.redis_url
        self._slot = slot_of(settings)
        self._cluster: redis.cluster.RedisCluster | None = None
        base = _SyncSlotSSLConnection if ssl else _SyncSlotConnection
        kwargs["connection_class"] = _connection_class(settings, base).get("connection_class", base)
        super().__init__(**kwargs)
        self.connection_kwargs["slot_pool"] = weakref.proxy(self)

    def slot_master(self) -> tuple[str, int]:
        """Ask the cluster afresh: a new connection is made after a failure, when
        the slot may have moved."""
        if self._cluster is None:
            self._cluster = redis.cluster.RedisCluster.from_url(self._url, **self._cluster_options)
        else:
            self._cluster.nodes_manager.initialize()
        node = self._cluster.nodes_manager.get_node_from_slot(self._slot)
        return str(node.host), int(node.port)

    # ``disconnect``, not ``close``: redis-py 5's client closes its pool with it.
    def disconnect(self, inuse_connections: bool = True) -> None:
        super().disconnect(inuse_connections)
        if inuse_connections and self._cluster is not None:
            self._cluster.close()
            self._cluster = None


class _AsyncSlotConnection(redis.asyncio.connection.Connection):
    def __init__(self, **kwargs: Any) -> None:
        self.slot_pool: _AsyncSlotPool = kwargs.pop("slot_pool")
        super().__init__(**kwargs)

    async def connect(self) -> None:
        await self.retry.call_with_retry(self._connect_to_slot_master, lambda error: asyncio.sleep(0))

    async def _connect_to_slot_master(self) -> None:
        if self._reader:
            return
        self.host, self.port = await self.slot_pool.slot_master()
        if CONNECT_CHECKS_HEALTH:
            await self.connect_check_health(check_health=False, retry_socket_connect=False)
        else:  # redis-py 5: its own connect, which retries the socket itself
            await super().connect()  # type: ignore[no-untyped-call]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except _ELSEWHERE as exc:
            await self.disconnect()
            raise _moved_to_connection_error(exc) from exc


class _AsyncSlotSSLConnection(_AsyncSlotConnection, redis.asyncio.connection.SSLConnection):
    pass


class _AsyncSlotPool(redis.asyncio.ConnectionPool):
    def __init__(self, settings: Settings, **options: Any) -> None:
        kwargs = _cluster_kwargs(settings, options)
        ssl = kwargs.pop("ssl", False)
        self._cluster_options = {**options, **_shared(kwargs)}
        self._url = settings.redis_url
        self._slot = slot_of(settings)
        self._cluster: redis.asyncio.cluster.RedisCluster | None = None
        self._asking = asyncio.Lock()
        base = _AsyncSlotSSLConnection if ssl else _AsyncSlotConnection
        renewing = _connection_class(settings, base, asyncio_class=True)
        kwargs["connection_class"] = renewing.get("connection_class", base)
        super().__init__(**kwargs)
        self.connection_kwargs["slot_pool"] = weakref.proxy(self)

    async def slot_master(self) -> tuple[str, int]:
        # One question at a time: after a failover every connection asks at once.
        async with self._asking:
            if self._cluster is None:
                self._cluster = redis.asyncio.cluster.RedisCluster.from_url(
                    self._url, **self._cluster_options
                )
                await self._cluster.initialize()
            else:
                await self._cluster.nodes_manager.initialize()
            node = self._cluster.nodes_manager.get_node_from_slot(self._slot)
            return str(node.host), int(node.port)

    # ``disconnect``, not ``aclose``: redis-py 5's client closes its pool with it.
    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections and self._cluster is not None:
            await self._cluster.aclose()
            self._cluster = None
