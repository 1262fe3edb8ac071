"""One queue of the SQS emulator: its messages, their FIFO groups and visibility.

The bookkeeping :class:`~fairpost.mailer.testing.sqs_fifo.Broker` keeps per
queue, apart from its requests: which messages a receive may take (a group
with a message in flight is held; groups take turns), when a hidden message
next becomes visible, retention and the deduplication window, and the receipt
handles that name a message. Every method runs under the broker's lock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from fairpost.mailer.testing.sqs_rules import Refuse

__all__ = ["DEDUP_WINDOW", "Message", "Queue", "Received", "new_receipt", "parse_receipt"]

DEDUP_WINDOW = 300.0
"""Seconds a deduplication id, and a receive attempt id, is remembered."""


@dataclass(eq=False)
class Message:
    """One message: its content never changes; its delivery state is the broker's, under its lock."""

    message_id: str
    body: str
    attributes: dict[str, dict[str, str]]
    system_attributes: dict[str, dict[str, str]]
    group_id: str | None
    dedup_id: str | None
    sequence_number: str | None
    sent_at: float
    sent_ms: int
    visible_at: float
    receive_count: int = 0
    first_receive_ms: int = 0
    receipt: str = ""
    changed: int = 0
    """Bumped by every receive, visibility change and move: a retried receive checks it."""
    dead_letter_source: str | None = None

    @property
    def body_md5(self) -> str:
        return hashlib.md5(self.body.encode()).hexdigest()

    def in_flight(self, now: float) -> bool:
        return self.receive_count > 0 and self.visible_at > now


@dataclass(frozen=True)
class Received:
    """A message as one receive delivered it, with its counts at that moment."""

    message: Message
    receipt: str
    receive_count: int
    first_receive_ms: int


@dataclass
class Queue:
    """One queue's messages and settings; every method runs under the broker's lock."""

    name: str
    url: str
    arn: str
    attributes: dict[str, str]
    cond: threading.Condition
    created: int = field(default_factory=lambda: int(time.time()))
    modified: int = field(default_factory=lambda: int(time.time()))
    messages: dict[str, Message] = field(default_factory=dict)  # in the order they arrived
    groups: dict[str, deque[Message]] = field(default_factory=dict)  # FIFO: each group in order
    served: dict[str, int] = field(default_factory=dict)  # group -> the receive that last took from it
    dedup: dict[tuple[str, str], tuple[float, Message]] = field(default_factory=dict)
    dedup_order: deque[tuple[float, tuple[str, str]]] = field(default_factory=deque)
    attempts: dict[str, tuple[float, list[tuple[Message, str, int]]]] = field(default_factory=dict)
    next_wake: float | None = None
    """When a hidden message next becomes visible, as the last :meth:`runs` found."""

    @property
    def fifo(self) -> bool:
        return self.attributes.get("FifoQueue") == "true"

    def setting(self, name: str) -> int:
        return int(self.attributes[name])

    def redrive(self) -> tuple[str, int] | None:
        raw = self.attributes.get("RedrivePolicy")
        if not raw:
            return None
        policy = json.loads(raw)
        return str(policy["deadLetterTargetArn"]), int(policy["maxReceiveCount"])

    def counts(self, now: float) -> tuple[int, int, int]:
        """(visible, in flight, delayed): a visible message of a held group counts as visible."""
        visible = in_flight = delayed = 0
        for message in self.messages.values():
            if message.visible_at <= now:
                visible += 1
            elif message.receive_count:
                in_flight += 1
            else:
                delayed += 1
        return visible, in_flight, delayed

    def add(self, message: Message) -> None:
        self.messages[message.message_id] = message
        if self.fifo and message.group_id is not None:
            self.groups.setdefault(message.group_id, deque()).append(message)

    def remove(self, message: Message) -> None:
        del self.messages[message.message_id]
        group = self.groups.get(message.group_id or "")
        if group is not None and self.fifo:
            group.remove(message)
            if not group:
                del self.groups[message.group_id or ""]

    def expire(self, now: float) -> None:
        """Forget messages past the retention period (the oldest come first), and old ids."""
        oldest = now - self.setting("MessageRetentionPeriod")
        while self.messages:
            first = next(iter(self.messages.values()))
            if first.sent_at > oldest:
                break
            self.remove(first)
        while self.dedup_order and self.dedup_order[0][0] <= now:
            _, key = self.dedup_order.popleft()
            if key in self.dedup and self.dedup[key][0] <= now:
                del self.dedup[key]
        for attempt_id in [a for a, (expires, _) in self.attempts.items() if expires <= now]:
            del self.attempts[attempt_id]

    def runs(self, now: float) -> Iterator[list[Message]]:
        """What a receive may take, in delivery order: for each group not held, its visible
        messages from the head (a standard queue: every visible message, in one run).
        Sets :attr:`next_wake`."""
        self.next_wake = None
        if not self.fifo:
            run = []
            for message in self.messages.values():
                if message.visible_at <= now:
                    run.append(message)
                else:
                    self._wake_at(message.visible_at)
            yield run
            return
        for group_id in sorted(self.groups, key=lambda g: (self.served.get(g, 0), self.groups[g][0].sent_at)):
            group = self.groups[group_id]
            if self._held(group, now):
                continue
            run = []
            for message in group:
                if message.visible_at > now:  # delayed: the rest of the group waits behind it
                    self._wake_at(message.visible_at)
                    break
                run.append(message)
            yield run

    def _held(self, group: deque[Message], now: float) -> bool:
        # Received messages are always a prefix of their group: a receive takes from the
        # head, a delete keeps a prefix a prefix, and new messages join at the end.
        for message in group:
            if not message.receive_count:
                return False
            if message.visible_at > now:
                self._wake_at(message.visible_at)
                return True
        return False

    def _wake_at(self, at: float) -> None:
        if self.next_wake is None or at < self.next_wake:
            self.next_wake = at


def new_receipt(queue: str, message_id: str) -> str:
    raw = f"{queue}\n{message_id}\n{uuid.uuid4().hex}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_receipt(handle: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
        queue, message_id, _ = raw.split("\n")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise Refuse.bad_receipt(handle) from None
    return queue, message_id
