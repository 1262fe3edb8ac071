"""The queues behind :mod:`fairpost.mailer.testing.sqs_server`: SQS's rules, without HTTP.

A :class:`Broker` holds the queues under one lock, so no two receives ever
interleave. FIFO queues keep AWS's rules, which the contract suite
(tests/contract/test_sqs_fifo.py) checks against every emulator:

- a group with a message in flight delivers nothing else until that message
  is deleted or visible again ("no more messages for the same message group
  ID are returned unless you delete the message, or it becomes visible"); so
  a head kept in flight holds its group while the rest of its batch is
  handed back at visibility 0;
- a receive takes as many messages of one group as it can, in order, then
  goes on to the next group; groups take turns (the one served longest ago
  first), so a deep group does not starve the others;
- a message made visible again keeps its place: a group comes back head first;
- a deduplication id is honoured for 5 minutes, whether or not the first copy
  is still in the queue (per group with ``DeduplicationScope=messageGroup``);
- a receipt handle expires with its visibility timeout (``InvalidParameterValue``,
  "The receipt handle has expired");
- a retried receive with the same ``ReceiveRequestAttemptId`` gets the same
  messages and receipt handles back, if none of them changed meanwhile.

A long poll waits on its queue's condition variable until a send, a delete or
a visibility change wakes it, or until the earliest moment a hidden message of
the queue becomes visible: an idle poll costs no CPU. A poll whose client went
away still completes and marks what it took as received, as SQS does. A
message received ``maxReceiveCount`` times moves to the dead-letter queue of
the queue's ``RedrivePolicy`` when a receive next finds it.

Not modelled: the 60 s before a deleted queue's name can be used again, the
60 s between purges, throughput and in-flight limits, permissions, tags,
message move tasks and the 12-hour visibility cap from the first receive.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Mapping

from fairpost.mailer.testing.sqs_queue import (
    DEDUP_WINDOW,
    Message,
    Queue,
    Received,
    new_receipt,
    parse_receipt,
)
from fairpost.mailer.testing.sqs_rules import (
    QUEUE_ATTRIBUTES,
    Refuse,
    check_throughput,
    checked_attributes,
    default_attributes,
)

__all__ = ["Broker"]


class Broker:
    """Every queue of one emulated account and region, behind one lock."""

    def __init__(self, *, region: str = "us-east-1", account_id: str = "123456789012") -> None:
        self.region = region
        self.account_id = account_id
        self.base_url = "http://127.0.0.1"
        self._lock = threading.Lock()
        self._queues: dict[str, Queue] = {}
        self._serial = 0
        self._stopping = False

    # -- queues ---------------------------------------------------------------------------

    def create_queue(self, name: str, attributes: Mapping[str, str]) -> str:
        fifo = str(attributes.get("FifoQueue", "false")).lower() == "true"
        stem = name.removesuffix(".fifo").replace("-", "").replace("_", "")
        if not 0 < len(name) <= 80 or not (stem.isascii() and stem.isalnum()):
            raise Refuse.invalid("QueueName", name, "1 to 80 letters, digits, hyphens or underscores")
        if fifo != name.endswith(".fifo"):
            raise Refuse.invalid("QueueName", name, "a FIFO queue's name, and only its, ends with .fifo")
        with self._lock:
            wanted = checked_attributes(attributes, fifo=fifo, creating=True, find=self._fifo_of)
            if not fifo:
                wanted.pop("FifoQueue", None)
            existing = self._queues.get(name)
            if existing is not None:
                if any(existing.attributes.get(k) != v for k, v in wanted.items()):
                    raise Refuse.error(
                        "QueueNameExists", f"A queue named {name} exists with other attributes."
                    )
                return existing.url
            queue = Queue(
                name=name,
                url=f"{self.base_url}/{self.account_id}/{name}",
                arn=f"arn:aws:sqs:{self.region}:{self.account_id}:{name}",
                attributes={**default_attributes(fifo), **wanted},
                cond=threading.Condition(self._lock),
            )
            check_throughput(queue.attributes)
            self._queues[name] = queue
            return queue.url

    def queue_url(self, name: str) -> str:
        with self._lock:
            return self._queue(name).url

    def delete_queue(self, url: str) -> None:
        with self._lock:
            queue = self._queue(url)
            del self._queues[queue.name]
            queue.cond.notify_all()

    def list_queues(self, prefix: str = "") -> list[str]:
        with self._lock:
            return [q.url for name, q in sorted(self._queues.items()) if name.startswith(prefix)]

    def purge(self, url: str) -> None:
        with self._lock:
            queue = self._queue(url)
            queue.messages.clear()
            queue.groups.clear()

    def get_attributes(self, url: str, names: list[str]) -> dict[str, str]:
        unknown = sorted(set(names) - QUEUE_ATTRIBUTES - {"All"})
        if unknown:
            raise Refuse.error("InvalidAttributeName", f"Unknown Attribute {unknown[0]}.")
        with self._lock:
            queue = self._queue(url)
            now = time.monotonic()
            queue.expire(now)
            visible, in_flight, delayed = queue.counts(now)
            every = {
                **queue.attributes,
                "ApproximateNumberOfMessages": str(visible),
                "ApproximateNumberOfMessagesNotVisible": str(in_flight),
                "ApproximateNumberOfMessagesDelayed": str(delayed),
                "CreatedTimestamp": str(queue.created),
                "LastModifiedTimestamp": str(queue.modified),
                "QueueArn": queue.arn,
            }
        return every if "All" in names else {name: every[name] for name in names if name in every}

    def set_attributes(self, url: str, attributes: Mapping[str, str]) -> None:
        with self._lock:
            queue = self._queue(url)
            wanted = checked_attributes(attributes, fifo=queue.fifo, creating=False, find=self._fifo_of)
            merged = {**queue.attributes, **wanted}
            check_throughput(merged)
            queue.attributes = {k: v for k, v in merged.items() if v or k != "RedrivePolicy"}
            queue.modified = int(time.time())
            queue.cond.notify_all()  # a shorter delay or retention changes what a poll waits for

    def _by_arn(self, arn: str) -> Queue | None:
        return next((q for q in self._queues.values() if q.arn == arn), None)

    def _fifo_of(self, arn: str) -> bool | None:
        queue = self._by_arn(arn)
        return None if queue is None else queue.fifo

    def _queue(self, url_or_name: str) -> Queue:
        queue = self._queues.get(url_or_name.rstrip("/").rsplit("/", 1)[-1])
        if queue is None:
            raise Refuse.no_queue()
        return queue

    # -- messages -------------------------------------------------------------------------

    def send(
        self,
        url: str,
        body: str,
        *,
        attributes: dict[str, dict[str, str]],
        system_attributes: dict[str, dict[str, str]],
        group_id: str | None,
        dedup_id: str | None,
        delay: int | None,
    ) -> Message:
        """Queue one message; returns it, or the message it duplicates."""
        with self._lock:
            queue = self._queue(url)
            now = time.monotonic()
            queue.expire(now)
            limit = queue.setting("MaximumMessageSize")
            if len(body.encode()) + len(json.dumps(attributes).encode()) > limit:
                raise Refuse.invalid(
                    "MessageBody", "(not shown)", f"Message must be shorter than {limit} bytes."
                )
            key = None
            if queue.fifo:
                key = self._dedup_key(queue, body, group_id, dedup_id, delay)
                seen = queue.dedup.get(key)
                if seen is not None and seen[0] > now:
                    return seen[1]
            elif dedup_id is not None:
                raise Refuse.invalid("MessageDeduplicationId", dedup_id, "not valid for a standard queue")
            self._serial += 1
            message = Message(
                message_id=str(uuid.uuid4()),
                body=body,
                attributes=attributes,
                system_attributes=system_attributes,
                group_id=group_id,
                dedup_id=None if key is None else key[1],
                sequence_number=f"{18 * 10**18 + self._serial:020d}" if queue.fifo else None,
                sent_at=now,
                sent_ms=int(time.time() * 1000),
                visible_at=now + (queue.setting("DelaySeconds") if delay is None else delay),
            )
            queue.add(message)
            if key is not None:
                queue.dedup[key] = (now + DEDUP_WINDOW, message)
                queue.dedup_order.append((now + DEDUP_WINDOW, key))
            queue.cond.notify_all()
            return message

    @staticmethod
    def _dedup_key(
        queue: Queue, body: str, group_id: str | None, dedup_id: str | None, delay: int | None
    ) -> tuple[str, str]:
        if group_id is None:
            raise Refuse.missing("MessageGroupId")
        if delay:
            raise Refuse.invalid("DelaySeconds", delay, "FIFO queues delay per queue, not per message")
        if dedup_id is None:
            if queue.attributes.get("ContentBasedDeduplication") != "true":
                raise Refuse.invalid(
                    "MessageDeduplicationId",
                    None,
                    "The queue should either have ContentBasedDeduplication enabled or "
                    "MessageDeduplicationId provided explicitly",
                )
            dedup_id = hashlib.sha256(body.encode()).hexdigest()
        return (group_id if queue.attributes.get("DeduplicationScope") == "messageGroup" else ""), dedup_id

    def receive(
        self, url: str, *, max_messages: int, wait: int | None, visibility: int | None, attempt_id: str | None
    ) -> list[Received]:
        """Take up to ``max_messages``, waiting up to ``wait`` s (the queue's default if None) for one."""
        with self._lock:
            queue = self._queue(url)
            deadline = time.monotonic() + (
                queue.setting("ReceiveMessageWaitTimeSeconds") if wait is None else wait
            )
            while True:
                now = time.monotonic()
                queue.expire(now)
                vt = queue.setting("VisibilityTimeout") if visibility is None else visibility
                taken = self._retried(queue, attempt_id, now, vt)
                if taken is None:
                    taken = self._take(queue, now, max_messages, vt)
                    if taken and attempt_id is not None and queue.fifo:
                        kept = [(r.message, r.receipt, r.message.changed) for r in taken]
                        queue.attempts[attempt_id] = (now + DEDUP_WINDOW, kept)
                if taken or self._stopping or now >= deadline:
                    return taken
                wake = deadline if queue.next_wake is None else min(deadline, queue.next_wake)
                queue.cond.wait(wake - now)
                queue = self._queue(queue.name)  # deleted meanwhile: QueueDoesNotExist

    @staticmethod
    def _retried(queue: Queue, attempt_id: str | None, now: float, vt: int) -> list[Received] | None:
        """The receive ``attempt_id`` made before, again; None if none, or if any message changed since."""
        _, taken = queue.attempts.get(attempt_id or "", (0.0, []))
        if not taken or any(
            queue.messages.get(m.message_id) is not m or m.receipt != receipt or m.changed != changed
            for m, receipt, changed in taken
        ):
            return None
        for message, _, _ in taken:
            message.visible_at = now + vt
        return [Received(m, receipt, m.receive_count, m.first_receive_ms) for m, receipt, _ in taken]

    def _take(self, queue: Queue, now: float, max_messages: int, vt: int) -> list[Received]:
        taken: list[Received] = []
        to_move: list[Message] = []
        redrive = queue.redrive()
        dead_letters = None if redrive is None else self._by_arn(redrive[0])
        self._serial += 1
        for run in queue.runs(now):
            for message in run:
                if len(taken) >= max_messages:
                    break
                if redrive is not None and dead_letters is not None and message.receive_count >= redrive[1]:
                    to_move.append(message)
                    continue
                message.receive_count += 1
                message.first_receive_ms = message.first_receive_ms or int(time.time() * 1000)
                message.receipt = new_receipt(queue.name, message.message_id)
                message.visible_at = now + vt
                message.changed += 1
                taken.append(
                    Received(message, message.receipt, message.receive_count, message.first_receive_ms)
                )
                if message.group_id is not None:
                    queue.served[message.group_id] = self._serial
            if len(taken) >= max_messages:
                break
        for message in to_move:
            assert dead_letters is not None
            queue.remove(message)
            message.receive_count = message.first_receive_ms = 0
            message.receipt, message.changed = "", message.changed + 1
            message.sent_at = message.visible_at = now
            message.dead_letter_source = queue.arn
            dead_letters.add(message)
            dead_letters.cond.notify_all()
        return taken

    def _message(self, queue: Queue, handle: str) -> Message | None:
        """The message ``handle`` names; None if it is gone."""
        queue_name, message_id = parse_receipt(handle)
        if queue_name != queue.name:
            raise Refuse.bad_receipt(handle)
        return queue.messages.get(message_id)

    def delete(self, url: str, handle: str) -> None:
        with self._lock:
            queue = self._queue(url)
            message = self._message(queue, handle)
            if message is None:
                return  # deleted already: SQS answers success
            if message.receipt != handle or (queue.fifo and message.visible_at <= time.monotonic()):
                if queue.fifo:
                    raise Refuse.expired(handle)
                return  # standard: an old handle "succeeds, but the message might not be deleted"
            queue.remove(message)
            message.changed += 1
            if queue.fifo and message.group_id in queue.groups:
                queue.cond.notify_all()  # its group may be free now

    def change_visibility(self, url: str, handle: str, seconds: int) -> None:
        with self._lock:
            queue = self._queue(url)
            message = self._message(queue, handle)
            now = time.monotonic()
            if message is None or message.receipt != handle:
                raise (
                    Refuse.expired(handle)
                    if queue.fifo and message is not None
                    else Refuse.bad_receipt(handle)
                )
            if not message.in_flight(now):
                if queue.fifo:
                    raise Refuse.expired(handle)
                raise Refuse.error(
                    "MessageNotInflight", "The message is not in flight: its visibility ended."
                )
            earlier = now + seconds < message.visible_at
            message.visible_at = now + seconds
            message.changed += 1
            if earlier:
                queue.cond.notify_all()  # visible sooner than a poll expects

    # -- lifecycle ------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every queue; a poll waiting on one ends with QueueDoesNotExist."""
        with self._lock:
            for queue in self._queues.values():
                queue.cond.notify_all()
            self._queues.clear()

    def close(self) -> None:
        """End every poll now, with what it has (nothing), and every later one at once."""
        with self._lock:
            self._stopping = True
            for queue in self._queues.values():
                queue.cond.notify_all()

    def open(self) -> None:
        with self._lock:
            self._stopping = False

    def queue_names(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)
