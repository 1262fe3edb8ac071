"""The asyncio clients pack commands with hiredis (dispatcher/packing.py): the same
bytes as redis-py's own packing for every argument fairpost sends, and redis-py's
own packing, or its own error, for what hiredis would take otherwise."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import pytest
import redis.asyncio.connection
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairpost.config import load_settings
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.packing import HIREDIS_PACKS, hiredis_packing

pytestmark = pytest.mark.skipif(not HIREDIS_PACKS, reason="hiredis is not installed")


class Colour(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    BIG = 3


COMMANDS: list[tuple[Any, ...]] = [
    ("GET", "k"),
    ("SET", "{p}:job:ü€😀", "välue", "PX", 60000),
    ("EVALSHA", "0" * 40, 2, "{p}:a", "{p}:b", 0, -1, 2**70, -(2**63), 1.5, 0.1, 1e20, 1e-7),
    ("HSET", "k", "f", float("inf"), "g", float("-inf"), "h", float("nan")),
    ("HSET", "k", b"\x00\xffbytes", b"", "", Colour.RED),
    ("SCRIPT LOAD", "return 1"),
    (b"SCRIPT LOAD", b"return 1"),
    (b"GET", memoryview(b"a view")),
    ("SET", "big", "x" * 100_000),
    ("SET", "big", b"y" * 100_000),
]

ODD: list[tuple[Any, ...]] = [
    ("SET", "k", True),
    ("SET", "k", Size.BIG),
    ("SET", "k", bytearray(b"array")),
    ("SET", "k", None),
    ("SET", "k", "\ud800"),  # a lone surrogate: UTF-8 cannot encode it
    ("SET", "k", object()),
    (memoryview(b"GET"), "k"),
]


def stock() -> redis.asyncio.connection.Connection:
    return redis.asyncio.connection.Connection()


def packed(**kwargs: Any) -> redis.asyncio.connection.Connection:
    client = hiredis_packing(redis.asyncio.Redis(**kwargs))
    pool = client.connection_pool
    connection = pool.connection_class(**pool.connection_kwargs)
    assert isinstance(connection, redis.asyncio.connection.Connection)
    return connection


def outcome(connection: redis.asyncio.connection.Connection, command: tuple[Any, ...]) -> bytes | type:
    try:
        return b"".join(bytes(chunk) for chunk in connection.pack_command(*command))
    except Exception as exc:  # the error's type is what must match
        return type(exc)


# Ids by position: a repr may hold an object's address, which differs between
# pytest-xdist's workers, and they must collect the same tests.
@pytest.mark.parametrize("command", COMMANDS + ODD, ids=[f"command{n}" for n in range(len(COMMANDS + ODD))])
def test_packs_what_redis_py_packs(command: tuple[Any, ...]) -> None:
    assert outcome(packed(), command) == outcome(stock(), command)


def test_odd_arguments_still_fail_as_redis_py_fails() -> None:
    with pytest.raises(DataError):
        packed().pack_command("SET", "k", True)
    nothing: Any = None
    with pytest.raises(DataError):
        packed().pack_command("SET", "k", nothing)


def test_a_pipeline_packs_the_same_bytes() -> None:
    def joined(connection: redis.asyncio.connection.Connection) -> bytes:
        return b"".join(bytes(c) for c in connection.pack_commands(COMMANDS))

    assert joined(packed()) == joined(stock())


def test_another_encoding_is_packed_by_redis_py() -> None:
    latin = packed(encoding="latin-1")
    assert b"".join(latin.pack_command("SET", "k", "é")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"


async def test_every_topology_packs_with_hiredis() -> None:
    """The client factory's clients (one server, TLS, Sentinel, cluster) pack with hiredis,
    their connection classes still what they were underneath."""
    for settings in (
        load_settings(redis_url="redis://localhost:6379/0"),
        load_settings(redis_url="rediss://localhost:6379/0"),
        load_settings(redis_url="redis://ignored/0", redis_sentinels="s1:26379", redis_sentinel_master="m"),
        load_settings(redis_url="redis://clustercfg.example:6379/0", redis_cluster=True),
    ):
        client = async_redis_client(settings)
        try:
            cls = client.connection_pool.connection_class
            stock = redis.asyncio.connection.Connection.pack_command
            assert cls.pack_command is not stock, settings.redis_url
            assert issubclass(cls, redis.asyncio.connection.AbstractConnection)
            if settings.redis_url.startswith("rediss:"):
                assert issubclass(cls, redis.asyncio.connection.SSLConnection)
        finally:
            await client.aclose()


async def test_round_trips_through_a_server(redis_url: str) -> None:
    """Commands packed by hiredis reach Redis as they were meant: a script's keys and
    arguments, and values of every kind, read back as written."""
    client = async_redis_client(load_settings(redis_url=redis_url))
    try:
        args: list[Any] = ["ü€", 7, -(2**62), 0.25, b"\x00\xff", "x" * 50_000]
        echoed = await client.eval("return ARGV", 1, "{t}:k", *args)
        assert echoed == ["ü€".encode(), b"7", str(-(2**62)).encode(), b"0.25", b"\x00\xff", b"x" * 50_000]
        assert await client.eval("return KEYS[1]", 1, "{t}:ké") == "{t}:ké".encode()
    finally:
        await client.aclose()


async def test_a_command_is_sent_without_a_task_of_its_own(redis_url: str) -> None:
    """redis-py writes each command under ``asyncio.wait_for`` when the client has a
    socket timeout (fairpost's always have), a new task a command in Python 3.11: these
    connections write at once, the timeout kept on the drain alone (#41)."""
    settings = load_settings(redis_url=redis_url)
    client = async_redis_client(settings)
    loop = asyncio.get_running_loop()
    created: list[Any] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    try:
        await client.set("{t}:k", "v")  # the connection opened
        loop.set_task_factory(counting)
        try:
            for _ in range(5):
                assert await client.get("{t}:k") == b"v"
        finally:
            loop.set_task_factory(factory)
        assert client.connection_pool.connection_kwargs["socket_timeout"]
        assert created == []
    finally:
        await client.aclose()


class _StuckWriter:
    """A socket whose buffer never drains."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def writelines(self, data: Any) -> None:
        self.written += [bytes(d) for d in data]

    async def drain(self) -> None:
        await asyncio.Event().wait()

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


async def test_a_write_that_does_not_drain_times_out_as_redis_py_says() -> None:
    connection = packed(socket_timeout=0.05)
    writer = _StuckWriter()
    connection._reader, connection._writer = object(), writer  # type: ignore[assignment]
    with pytest.raises(RedisTimeoutError, match="Timeout writing to socket"):
        await connection.send_packed_command(connection.pack_command("GET", "k"), check_health=False)
    assert writer.written == [b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"]
    assert writer.closed and not connection.is_connected
