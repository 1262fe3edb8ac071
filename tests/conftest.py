"""Fixtures every folder shares: real services, and the clients most tests talk through.

Servers (redis-server, moto, LocalStack) start once per session, through
fairpost.mailer.testing like the demo's and the benchmarks'; every test gets a flushed
Redis and a reset moto, and the AWS variables boto3 reads point at moto. Each
folder's conftest.py adds what only its tests use; a test module that needs
other settings overrides ``settings`` and keeps the clients built on it.
"""

from __future__ import annotations

import gc
import logging
import sys
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import boto3
import pytest
import redis
import redis.asyncio
import redis.asyncio.connection

from fairpost import AsyncMailClient, MailClient
from fairpost.config import Settings, load_settings
from fairpost.mailer.testing.localstack import LocalStackServer, localstack_server
from fairpost.mailer.testing.services import (
    MotoServer,
    RedisServer,
    fifo_sqs_server,
    moto_server,
    redis_server,
)
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.sqs_server import SqsServer
from tests.support.memory import LimitedRedis, limited_redis
from tests.support.topologies import Cluster, SentinelGroup, redis_cluster, redis_sentinel

# The in-process emulators log each request through werkzeug, which gives its logger a
# stream handler of its own on first use: bound to whatever sys.stderr was then (a
# test's captured stream, closed after it), it printed "Logging error" tracebacks into
# later tests' stderr. A handler here keeps werkzeug from adding one; the records
# still reach pytest's log capture through the root logger.
logging.getLogger("werkzeug").addHandler(logging.NullHandler())


def _start_rank(item: pytest.Item) -> int:
    """0 for the benchmark runs (minutes each), 1 for the other end-to-end tests, 2 for the rest."""
    if item.get_closest_marker("bench") is not None:
        return 0
    return 1 if item.get_closest_marker("slow") is not None else 2


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first, the many short ones after them (a stable sort: within
    each rank, collection order).

    pytest-xdist hands tests to its workers in this order: started last, a test of
    minutes would leave the other worker idle for its length at the end of the run;
    started first, the short tests fill in around it."""
    items.sort(key=_start_rank)


@pytest.fixture(scope="session")
def redis_srv() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def redis_url(redis_srv: RedisServer) -> Iterator[str]:
    client = redis.Redis.from_url(redis_srv.url())
    client.flushall()
    client.close()
    yield redis_srv.url()


@pytest.fixture(scope="session")
def limited_redis_srv() -> Iterator[LimitedRedis]:
    """redis-servers with a small ``--maxmemory``, one per ``--maxmemory-policy``,
    each started on first use (tests/support/memory.py): ``.url(policy)``."""
    with limited_redis() as servers:
        yield servers


@pytest.fixture(scope="session")
def cluster_srv() -> Iterator[Cluster]:
    """A 6-node Redis Cluster, started once, on first use (tests marked ``cluster``)."""
    with redis_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def sentinel_srv() -> Iterator[SentinelGroup]:
    """A master, a replica and three sentinels, started once, on first use (``sentinel``)."""
    with redis_sentinel() as group:
        yield group


@pytest.fixture(
    params=[
        pytest.param("cluster", marks=pytest.mark.cluster),
        pytest.param("sentinel", marks=pytest.mark.sentinel),
    ]
)
def topology(request: pytest.FixtureRequest) -> dict[str, object]:
    """The settings that point fairpost at a flushed replicated topology, one per param."""
    if request.param == "cluster":
        cluster: Cluster = request.getfixturevalue("cluster_srv")
        cluster.flush()
        return {"redis_url": cluster.url, "redis_cluster": True}
    group: SentinelGroup = request.getfixturevalue("sentinel_srv")
    group.flush()
    return {
        "redis_url": "redis://fairpost-master/0",  # Sentinel names the host
        "redis_sentinels": group.sentinel_addresses,
        "redis_sentinel_master": "fairpost",
    }


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """The asyncio twin of ``redis_client``: replies decoded to str."""
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def settings(redis_url: str) -> Settings:
    """The defaults, on this test's Redis."""
    return load_settings(redis_url=redis_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[MailClient]:
    with MailClient(settings) as mail_client:
        yield mail_client


@pytest.fixture
async def aclient(settings: Settings) -> AsyncIterator[AsyncMailClient]:
    async with AsyncMailClient(settings) as mail_client:
        yield mail_client


@pytest.fixture(scope="session")
def moto_srv() -> Iterator[MotoServer]:
    with moto_server() as server:
        yield server


@pytest.fixture(scope="session")
def localstack_srv() -> Iterator[LocalStackServer]:
    """LocalStack's SQS, started on first use.

    FIFO-faithful where moto is not: docs/design.md, "What the emulators get wrong".
    """
    with localstack_server() as server:
        yield server


@pytest.fixture(scope="session")
def fifo_sqs_srv() -> Iterator[SqsServer]:
    """fairpost's own SQS, which keeps AWS's FIFO rules (mailer/testing/sqs_server.py)."""
    with fifo_sqs_server() as server:
        yield server


@pytest.fixture
def aws_env(moto_srv: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point boto3 at moto through the standard variables; returns the endpoint."""
    moto_srv.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_srv.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_SESV2"):
        monkeypatch.delenv(name, raising=False)
    yield moto_srv.url


@pytest.fixture
def ses() -> Iterator[SesServer]:
    """The recording SES v2 server (mailer/testing/ses_server.py), fresh for each test."""
    with SesServer() as server:
        yield server


@pytest.fixture
def ses_env(aws_env: str, ses: SesServer, monkeypatch: pytest.MonkeyPatch) -> SesServer:
    """boto3 as the pipeline sees it: SQS from moto, SES v2 from the recording server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", ses.url)
    return ses


@pytest.fixture(autouse=True)
def _no_stray_fairpost_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own FAIRPOST_* variables must not leak into tests."""
    import os

    for name in list(os.environ):
        if name.startswith("FAIRPOST_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _close_boto3_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every boto3 client a test makes is closed when the test ends.

    Tests build throw-away clients in many helpers; an unclosed one leaves its
    connection pool to the garbage collector, whose ResourceWarning then fails
    whichever later test happens to collect it. The product closes its own.
    """
    made: list[object] = []
    real = boto3.client

    def tracked(*args: object, **kwargs: object) -> object:
        client = real(*args, **kwargs)
        made.append(client)
        return client

    monkeypatch.setattr(boto3, "client", tracked)
    yield
    for client in made:
        client.close()  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_open_async_redis_connection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No asyncio Redis connection a test made is still open once its event loops are closed.

    Such a connection is left to the garbage collector, whose ResourceWarning
    ("unclosed Connection") then fails whichever later test is running when it
    collects. The usual cause is a task that outlived the shutdown: it used the
    client after ``aclose()``, and redis-py opened a new connection for it.
    Checked here, after the test's loop is gone, the failure names the test that
    leaked. Set up before pytest-asyncio's loop, so torn down after it.
    """
    made: weakref.WeakSet[redis.asyncio.connection.AbstractConnection] = weakref.WeakSet()
    real = redis.asyncio.connection.AbstractConnection.__init__

    def tracked(self: redis.asyncio.connection.AbstractConnection, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        made.add(self)

    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "__init__", tracked)
    yield
    left_open = [repr(conn) for conn in made if conn.is_connected]
    if not left_open:
        return
    # Collected now, their warnings said here: this test fails, not a later one.
    said: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: said.append(f"{unraisable.exc_value!r}")
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook
    pytest.fail(f"asyncio Redis connections left open after the test's event loop closed: {left_open} {said}")
