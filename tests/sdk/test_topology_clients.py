"""The client factory (dispatcher/connect.py) turns the settings into redis-py
arguments: credentials, TLS and database of the data nodes from FAIRPOST_REDIS_URL,
the sentinels' own password and TLS from their settings. Built only, not connected
(the real topologies are in tests/e2e/test_topologies.py)."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio.sentinel
import redis.sentinel

from fairpost.config import load_settings
from fairpost.dispatcher.connect import async_redis_client, redis_client

SECRET = "n0de-Pa55"
SENTINEL_SECRET = "sent1nel-Pa55"


def sentinel_settings() -> dict[str, object]:
    return {
        "redis_url": f"rediss://app:{SECRET}@ignored-host/2",
        "redis_sentinels": "s1:26379,s2:26379",
        "redis_sentinel_master": "mymaster",
        "redis_sentinel_password": SENTINEL_SECRET,
        "redis_sentinel_tls": True,
    }


def test_sentinel_clients_carry_both_credentials_and_tls() -> None:
    settings = load_settings(**sentinel_settings())
    client = redis_client(settings)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    node = pool.connection_kwargs
    assert (node["username"], node["password"], node["db"]) == ("app", SECRET, 2)
    assert issubclass(pool.connection_class, redis.connection.SSLConnection)
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["host"] for s in sentinels] == ["s1", "s2"]
    for sentinel in sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        assert kwargs["password"] == SENTINEL_SECRET
        assert issubclass(sentinel.connection_pool.connection_class, redis.connection.SSLConnection)
    client.close()


async def test_async_sentinel_client_is_built_the_same_way() -> None:
    settings = load_settings(**sentinel_settings())
    client = async_redis_client(settings)
    pool = client.connection_pool
    assert isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool)
    assert pool.connection_kwargs["password"] == SECRET
    for sentinel in pool.sentinel_manager.sentinels:
        assert sentinel.connection_pool.connection_kwargs["password"] == SENTINEL_SECRET
    await client.aclose()


def test_cluster_client_is_lazy_and_keeps_the_url_credentials() -> None:
    settings = load_settings(redis_url=f"rediss://:{SECRET}@clustercfg.example:6379/0", redis_cluster=True)
    client = redis_client(settings)  # nothing connects until the first command
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["password"] == SECRET
    assert issubclass(client.connection_pool.connection_class, redis.connection.SSLConnection)
    client.close()


def test_the_ca_file_reaches_the_data_nodes_and_the_sentinels(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read until a connection is made")
    settings = load_settings(**sentinel_settings(), redis_tls_ca_file=ca)
    client = redis_client(settings)
    pool = client.connection_pool
    assert pool.connection_kwargs["ssl_ca_certs"] == str(ca)
    for sentinel in pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
        assert sentinel.connection_pool.connection_kwargs["ssl_ca_certs"] == str(ca)
    client.close()
