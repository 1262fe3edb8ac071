"""Commands packed in C by hiredis, not in Python, on the asyncio connections.

redis-py's blocking connections pack a command with ``hiredis.pack_command`` when
hiredis is installed; its asyncio ones always pack it in Python: an encode and a
bytes join for each argument, and each join copies all the command before it. A
replica's scripts take hundreds of arguments a batch (``finish.lua`` names four
keys and a journal entry a job), and that packing was about a twentieth of the
user-space instructions a replica spends a job (#41: 0.74 µs an argument in
Python, 0.14 µs in C).

They also write a command without a task of its own: redis-py sends each command
under ``asyncio.wait_for`` when the client has a ``socket_timeout`` (fairpost's
always do), and in Python 3.11 that wraps the write in a new task, with its timer,
its callbacks and a turn of the event loop before the write even starts: the
commands of a mail cost more in that than in their packing (#41). Here the write
is made at once and only the drain (which waits only while the socket's buffer is
full) runs under the timeout: the same bytes, the same errors
(redis-py's ``TimeoutError`` and ``ConnectionError``, the connection closed).

The bytes on the wire are the same: hiredis writes a ``str`` as UTF-8 and an
``int`` or a ``float`` as its ``repr``, as redis-py's encoder does with its
defaults. Whatever hiredis does not take the same way (a connection encoding
other than strict UTF-8, a ``bool``, an ``IntEnum``, a ``bytearray``, a string
UTF-8 cannot encode) goes to redis-py's own packing, which packs it or raises its
own error. Without hiredis (an application's SDK need not have it) nothing changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis.asyncio
import redis.asyncio.connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - the daemon's extra installs it
    _hiredis_pack = None

__all__ = ["HIREDIS_PACKS", "hiredis_packing"]

HIREDIS_PACKS = _hiredis_pack is not None


def _pack(words: tuple[Any, ...]) -> bytes:
    assert _hiredis_pack is not None  # a class packing with it exists only then
    return _hiredis_pack(words)


_C = TypeVar("_C", bound=type[Any])

_UTF8 = frozenset({"utf-8", "utf8", "UTF-8", "UTF8"})


class _HiredisPacking:
    """A connection mixin: :meth:`pack_command` by hiredis where it packs the same bytes,
    and :meth:`send_packed_command` with no task a command."""

    encoder: Any
    socket_timeout: float | None
    is_connected: bool
    _writer: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        first = args[0]
        if type(first) in (str, bytes) and encoder.encoding in _UTF8 and encoder.encoding_errors == "strict":
            try:
                # As redis-py does: a command name of several words ("SCRIPT LOAD") is split.
                if type(first) is str:
                    words = (*first.encode().split(), *args[1:])
                else:
                    words = (*first.split(), *args[1:]) if b" " in first else args
                return [_pack(words)]
            except (TypeError, ValueError):
                pass  # redis-py packs it (or raises its own error)
        packed: list[bytes] = super().pack_command(*args)  # type: ignore[misc]
        return packed

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        timeout = self.socket_timeout
        if not timeout or not self.is_connected:
            # No timeout to keep (no task either), or a connection to open first.
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        if check_health:
            await self.check_health()  # type: ignore[attr-defined]
        try:
            if isinstance(command, str):
                command = command.encode()
            self._writer.writelines([command] if isinstance(command, bytes) else command)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            err_no, errmsg = ("UNKNOWN", e.args[0]) if len(e.args) == 1 else (e.args[0], e.args[1])
            raise RedisConnectionError(f"Error {err_no} while writing to socket. {errmsg}.") from e
        except BaseException:
            # As redis-py: a write cut off leaves the connection unusable.
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise


_classes: dict[type[Any], type[Any]] = {}


def _packing(base: _C) -> _C:
    """``base`` packing with hiredis: one class each, however many clients use it."""
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(base.__name__, (_HiredisPacking, base), {"__module__": __name__})
    return cls  # type: ignore[return-value]


def hiredis_packing(client: redis.asyncio.Redis) -> redis.asyncio.Redis:
    """``client``, its connections (those made from now on) packing commands with
    hiredis when it is installed; the client itself, unchanged, when it is not."""
    if _hiredis_pack is None:
        return client
    pool: redis.asyncio.connection.ConnectionPool = client.connection_pool
    if not issubclass(pool.connection_class, _HiredisPacking):
        pool.connection_class = _packing(pool.connection_class)
    return client
