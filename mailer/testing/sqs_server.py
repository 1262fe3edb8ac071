"""An SQS server that keeps AWS's FIFO rules, for the tests, the demo and the benchmarks.

moto's SQS breaks FIFO rules fairpost's figures rest on and its long poll
spins a core; LocalStack reopens a group when a handed-back message returns
while the group's head is still in flight (the verdict table in
tests/contract/test_sqs_fifo.py). This is a real HTTP server on 127.0.0.1
(standard library only, one thread per connection, like the recording SES
server) speaking the AWS JSON 1.0 protocol botocore uses for SQS
(``X-Amz-Target: AmazonSQS.<Operation>``), errors with ``__type`` and the
``x-amzn-query-error`` header, so botocore reports SQS's codes
(``AWS.SimpleQueueService.NonExistentQueue``, ``ReceiptHandleIsInvalid``,
``InvalidParameterValue``, ``MissingParameter``, ...) and raises the modelled
exceptions (``client.exceptions.QueueDoesNotExist``). The queues and their
rules are :mod:`fairpost.mailer.testing.sqs_fifo`'s; what SQS refuses is
:mod:`fairpost.mailer.testing.sqs_rules`'.

Operations: CreateQueue, GetQueueUrl, DeleteQueue, ListQueues,
GetQueueAttributes, SetQueueAttributes, PurgeQueue, SendMessage(Batch),
ReceiveMessage, DeleteMessage(Batch), ChangeMessageVisibility(Batch).
Message attributes (String, Number, Binary) and ``AWSTraceHeader`` travel
with their MD5s as SQS computes them.

Example::

    with SqsServer() as sqs:
        client = boto3.client("sqs", endpoint_url=sqs.url, region_name="us-east-1", ...)

In a process of its own: ``python -m fairpost.mailer.testing.sqs_server --port 4566``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import signal
import struct
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from fairpost.mailer.testing import sqs_rules as field
from fairpost.mailer.testing.http_endpoint import Answer as HttpAnswer
from fairpost.mailer.testing.http_endpoint import HttpEndpoint
from fairpost.mailer.testing.http_endpoint import Request as HttpRequest
from fairpost.mailer.testing.sqs_fifo import Broker
from fairpost.mailer.testing.sqs_queue import Received
from fairpost.mailer.testing.sqs_rules import Refuse, SqsError

__all__ = ["SqsError", "SqsServer", "attributes_md5", "main"]

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
SENDER_ID = "AIDAIT2UOQQY3AUEKVGXU"
_TARGET_PREFIX = "AmazonSQS."
_BATCH_BYTES = 1_048_576

Request = dict[str, Any]
Answer = dict[str, Any]


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()  # SQS's checksum, not security


def attributes_md5(attributes: Mapping[str, Mapping[str, str]]) -> str:
    """SQS's digest of message attributes as JSON carries them (binary values in base64):
    by name in sorted order, the length-prefixed name and type, then 1 and the string
    or 2 and the bytes, length-prefixed too."""
    digest = hashlib.md5()  # SQS's checksum, not security

    def put(data: bytes) -> None:
        digest.update(struct.pack("!I", len(data)))
        digest.update(data)

    for name in sorted(attributes):
        value = attributes[name]
        put(name.encode())
        put(value["DataType"].encode())
        if "BinaryValue" in value:
            digest.update(b"\x02")
            put(base64.b64decode(value["BinaryValue"]))
        else:
            digest.update(b"\x01")
            put(value["StringValue"].encode())
    return digest.hexdigest()


# -- operations ------------------------------------------------------------------------------


def _create_queue(broker: Broker, request: Request) -> Answer:
    url = broker.create_queue(field.required(request, "QueueName"), field.string_map(request, "Attributes"))
    return {"QueueUrl": url}


def _get_queue_url(broker: Broker, request: Request) -> Answer:
    return {"QueueUrl": broker.queue_url(field.required(request, "QueueName"))}


def _delete_queue(broker: Broker, request: Request) -> Answer:
    broker.delete_queue(field.required(request, "QueueUrl"))
    return {}


def _list_queues(broker: Broker, request: Request) -> Answer:
    urls = broker.list_queues(field.string(request, "QueueNamePrefix") or "")
    limit = field.integer(request, "MaxResults", 1, 1000)
    if limit is None:
        return {"QueueUrls": urls[:1000]} if urls else {}
    token = field.string(request, "NextToken") or "0"
    start = int(token) if token.isdigit() else 0
    page: Answer = {"QueueUrls": urls[start : start + limit]}
    if start + limit < len(urls):
        page["NextToken"] = str(start + limit)
    return page


def _get_queue_attributes(broker: Broker, request: Request) -> Answer:
    url = field.required(request, "QueueUrl")
    attributes = broker.get_attributes(url, field.names(request, "AttributeNames"))
    return {"Attributes": attributes} if attributes else {}


def _set_queue_attributes(broker: Broker, request: Request) -> Answer:
    broker.set_attributes(field.required(request, "QueueUrl"), field.string_map(request, "Attributes"))
    return {}


def _purge_queue(broker: Broker, request: Request) -> Answer:
    broker.purge(field.required(request, "QueueUrl"))
    return {}


def _send(broker: Broker, url: str, entry: Request) -> Answer:
    body = field.checked_body(entry)
    attributes = field.message_attributes(entry.get("MessageAttributes"))
    system = field.message_attributes(entry.get("MessageSystemAttributes"), system=True)
    message = broker.send(
        url,
        body,
        attributes=attributes,
        system_attributes=system,
        group_id=field.token(entry, "MessageGroupId"),
        dedup_id=field.token(entry, "MessageDeduplicationId"),
        delay=field.integer(entry, "DelaySeconds", 0, 900),
    )
    # A duplicate answers with the first copy's id, and the checksum of what was sent now.
    answer: Answer = {"MessageId": message.message_id, "MD5OfMessageBody": _md5(body)}
    if attributes:
        answer["MD5OfMessageAttributes"] = attributes_md5(attributes)
    if system:
        answer["MD5OfMessageSystemAttributes"] = attributes_md5(system)
    if message.sequence_number is not None:
        answer["SequenceNumber"] = message.sequence_number
    return answer


def _send_message(broker: Broker, request: Request) -> Answer:
    return _send(broker, field.required(request, "QueueUrl"), request)


def _receive_message(broker: Broker, request: Request) -> Answer:
    url = field.required(request, "QueueUrl")
    system = field.system_names(request)
    wanted = field.names(request, "MessageAttributeNames")
    received = broker.receive(
        url,
        max_messages=field.integer(request, "MaxNumberOfMessages", 1, 10) or 1,
        wait=field.integer(request, "WaitTimeSeconds", 0, 20),
        visibility=field.integer(request, "VisibilityTimeout", 0, 43_200),
        attempt_id=field.token(request, "ReceiveRequestAttemptId"),
    )
    return {"Messages": [_delivered(r, system, wanted) for r in received]} if received else {}


def _delivered(received: Received, system: set[str], wanted: list[str]) -> Answer:
    message = received.message
    every = {
        "SenderId": SENDER_ID,
        "SentTimestamp": str(message.sent_ms),
        "ApproximateReceiveCount": str(received.receive_count),
        "ApproximateFirstReceiveTimestamp": str(received.first_receive_ms),
        "SequenceNumber": message.sequence_number,
        "MessageGroupId": message.group_id,
        "MessageDeduplicationId": message.dedup_id,
        "DeadLetterQueueSourceArn": message.dead_letter_source,
        "AWSTraceHeader": message.system_attributes.get("AWSTraceHeader", {}).get("StringValue"),
    }
    chosen = {k: v for k, v in every.items() if v is not None and ("All" in system or k in system)}
    answer: Answer = {
        "MessageId": message.message_id,
        "ReceiptHandle": received.receipt,
        "MD5OfBody": message.body_md5,
        "Body": message.body,
    }
    if chosen:
        answer["Attributes"] = chosen
    everything = "All" in wanted or ".*" in wanted
    prefixes = tuple(w[:-1] for w in wanted if w.endswith(".*"))
    attributes = {
        name: value
        for name, value in message.attributes.items()
        if everything or name in wanted or (prefixes and name.startswith(prefixes))
    }
    if attributes:
        answer["MessageAttributes"] = attributes
        answer["MD5OfMessageAttributes"] = attributes_md5(attributes)
    return answer


def _delete_message(broker: Broker, request: Request) -> Answer:
    broker.delete(field.required(request, "QueueUrl"), field.required(request, "ReceiptHandle"))
    return {}


def _visibility(request: Request) -> int:
    seconds = field.integer(request, "VisibilityTimeout", 0, 43_200)
    if seconds is None:
        raise Refuse.missing("VisibilityTimeout")
    return seconds


def _change_message_visibility(broker: Broker, request: Request) -> Answer:
    url = field.required(request, "QueueUrl")
    broker.change_visibility(url, field.required(request, "ReceiptHandle"), _visibility(request))
    return {}


def _batch(entries: list[Request], each: Callable[[Request], Answer]) -> Answer:
    """Run ``each`` on every entry: an entry's error is its own, in ``Failed``."""
    successful: list[Answer] = []
    failed: list[Answer] = []
    for entry in entries:
        try:
            successful.append({"Id": entry["Id"], **each(entry)})
        except SqsError as exc:
            fault = exc.status < 500
            failed.append({"Id": entry["Id"], "SenderFault": fault, "Code": exc.code, "Message": exc.message})
    return {"Successful": successful, "Failed": failed}


def _send_message_batch(broker: Broker, request: Request) -> Answer:
    url = field.required(request, "QueueUrl")
    entries = field.batch_entries(request, "SendMessageBatch")
    if sum(len(str(e.get("MessageBody", "")).encode()) for e in entries) > _BATCH_BYTES:
        raise Refuse.error("BatchRequestTooLong", "Batch requested message too long")
    return _batch(entries, lambda entry: _send(broker, url, entry))


def _delete_message_batch(broker: Broker, request: Request) -> Answer:
    url = field.required(request, "QueueUrl")

    def delete(entry: Request) -> Answer:
        broker.delete(url, field.required(entry, "ReceiptHandle"))
        return {}

    return _batch(field.batch_entries(request, "DeleteMessageBatch"), delete)


def _change_message_visibility_batch(broker: Broker, request: Request) -> Answer:
    url = field.required(request, "QueueUrl")

    def change(entry: Request) -> Answer:
        broker.change_visibility(url, field.required(entry, "ReceiptHandle"), _visibility(entry))
        return {}

    return _batch(field.batch_entries(request, "ChangeMessageVisibilityBatch"), change)


OPERATIONS: Mapping[str, Callable[[Broker, Request], Answer]] = {
    "CreateQueue": _create_queue,
    "GetQueueUrl": _get_queue_url,
    "DeleteQueue": _delete_queue,
    "ListQueues": _list_queues,
    "GetQueueAttributes": _get_queue_attributes,
    "SetQueueAttributes": _set_queue_attributes,
    "PurgeQueue": _purge_queue,
    "SendMessage": _send_message,
    "SendMessageBatch": _send_message_batch,
    "ReceiveMessage": _receive_message,
    "DeleteMessage": _delete_message,
    "DeleteMessageBatch": _delete_message_batch,
    "ChangeMessageVisibility": _change_message_visibility,
    "ChangeMessageVisibilityBatch": _change_message_visibility_batch,
}


# -- the server ------------------------------------------------------------------------------


class SqsServer:
    """SQS on ``host`` (127.0.0.1) at ``port`` (0: a free one); ``url`` once started."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        region: str = "us-east-1",
        account_id: str = "123456789012",
    ) -> None:
        self.broker = Broker(region=region, account_id=account_id)
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._errors: list[BaseException] = []
        self._http = HttpEndpoint(
            self._answer, self._failed, name="sqs-server", host=host, port=port, poll_interval=0.25
        )

    def start(self) -> SqsServer:
        self._http.start()
        self.broker.base_url = self.url
        self.broker.open()
        return self

    def stop(self) -> None:
        """End open polls (they answer with no messages), close every connection; idempotent."""
        if not self._http.running:
            return
        self.broker.close()
        self._http.stop()

    def __enter__(self) -> SqsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        return self._http.url

    def reset(self) -> None:
        """Forget every queue, message and count (polls open on a queue end with QueueDoesNotExist)."""
        self.broker.reset()
        with self._lock:
            self._requests.clear()
            self._errors.clear()

    def requests(self) -> dict[str, int]:
        """Calls answered so far, by operation (``ReceiveMessage``, ...)."""
        with self._lock:
            return dict(self._requests)

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised while handling requests (answered as 500 InternalFailure): a bug here."""
        with self._lock:
            return list(self._errors)

    def _answer(self, request: HttpRequest) -> HttpAnswer:
        if request.method != "POST":
            return _http_answer(400, {"__type": "InvalidAction", "message": "SQS's JSON protocol is POST"})
        status, answer, query_error = self._handle(request.headers.get("x-amz-target", ""), request.body)
        return _http_answer(status, answer, query_error)

    def _failed(self, exc: Exception) -> HttpAnswer:
        with self._lock:
            self._errors.append(exc)
        error = {"__type": "InternalFailure", "message": f"SqsServer error: {exc!r}"}
        return _http_answer(500, error, "InternalFailure;Receiver")

    def _handle(self, target: str, body: bytes) -> tuple[int, Answer, str | None]:
        """(status, JSON answer, the x-amzn-query-error header or None)."""
        name = target.removeprefix(_TARGET_PREFIX) if target.startswith(_TARGET_PREFIX) else ""
        with self._lock:
            self._requests[name or "(none)"] += 1
        try:
            operation = OPERATIONS.get(name)
            if operation is None:
                raise Refuse.error(
                    "UnsupportedOperation",
                    "SqsServer speaks SQS's JSON protocol (X-Amz-Target: AmazonSQS.<Operation>) for "
                    f"{', '.join(OPERATIONS)}; not {target or 'a request without X-Amz-Target'}",
                )
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                raise Refuse.error("SerializationException", "The request body is not JSON.") from None
            if not isinstance(request, dict):
                raise Refuse.error("SerializationException", "The request body is not a JSON object.")
            return 200, operation(self.broker, request), None
        except SqsError as exc:
            error = {"__type": f"com.amazonaws.sqs#{exc.shape}", "message": exc.message}
            return exc.status, error, f"{exc.code};{'Sender' if exc.status < 500 else 'Receiver'}"


def _http_answer(status: int, answer: Answer, query_error: str | None = None) -> HttpAnswer:
    headers = {} if query_error is None else {"x-amzn-query-error": query_error}
    return HttpAnswer(status, json.dumps(answer).encode(), content_type=JSON_CONTENT_TYPE, headers=headers)


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT (the demo and the benchmarks run it as a process)."""
    parser = argparse.ArgumentParser(prog="python -m fairpost.mailer.testing.sqs_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with SqsServer(host=args.host, port=args.port) as server:
        print(f"SqsServer listening on {server.url}", flush=True)
        while not stop.wait(3600):
            pass


if __name__ == "__main__":
    main()
