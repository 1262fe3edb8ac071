"""Redis answers as Python values: text (a client without ``decode_responses``
gives bytes, one with it gives str; fairpost's code reads either) and the
server's clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Queued", "record", "text", "time_ms"]

T = TypeVar("T")


def text(value: Any) -> str:
    """A reply as text: bytes decoded as UTF-8, anything else (str, int) as ``str()``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def record(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A hash (``HGETALL``) as text; empty when the key does not exist."""
    return {text(k): text(v) for k, v in raw.items()}


def time_ms(reply: Sequence[Any]) -> int:
    """``TIME``'s answer (seconds, microseconds) as ms since the epoch: Redis's clock,
    the one every stored time is read from."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


@dataclass(frozen=True)
class Queued(Generic[T]):
    """Reads queued on a pipeline beside others (one round trip for them all): their
    ``size`` replies, and how those read. Owners of stored state queue their own
    reads; the caller only runs the pipeline and hands each its replies in turn."""

    size: int
    read: Callable[[Sequence[Any]], T]

    def take(self, replies: Iterator[Any]) -> T:
        """This read's answer, from the next ``size`` of the pipeline's ``replies``."""
        return self.read([next(replies) for _ in range(self.size)])
