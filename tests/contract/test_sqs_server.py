"""fairpost's own SQS (mailer/testing/sqs_server.py): the wire details the FIFO contract does not cover.

Its FIFO rules are tests/contract/test_sqs_fifo.py's (the ``fifo_sqs``
parameter). Here: checksums, error codes as botocore reports them, queue and
message attributes, long polls (no CPU while idle; woken by a send or a
visibility change; a poll whose client left still takes its messages), receive
retries, redrive, and that fairpost's own queue set-up finds what it wants.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aioboto3
import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from fairpost.config import load_settings
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.testing.services import MotoServer
from fairpost.mailer.testing.sqs_server import SqsServer
from fairpost.mailer.testing.wait import wait_for
from tests.contract.conftest import SQSClient

FIFO = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
ATTRIBUTES = {
    "tenant": {"DataType": "String", "StringValue": "acme ünïcode"},
    "attempt": {"DataType": "Number", "StringValue": "3"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff"},
    "kind": {"DataType": "String.custom", "StringValue": "x"},
}


def client_for(url: str) -> SQSClient:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=30),
    )


@pytest.fixture
def sqs(fifo_sqs_srv: SqsServer) -> Iterator[SQSClient]:
    client = client_for(fifo_sqs_srv.url)
    yield client
    client.close()


MakeQueue = Callable[..., str]


@pytest.fixture
def make_queue(sqs: SQSClient) -> Iterator[MakeQueue]:
    """``make_queue(fifo=True, **attributes)``: a fresh queue's URL, deleted afterwards."""
    made: list[str] = []

    def make(*, fifo: bool = True, name: str | None = None, **attributes: str) -> str:
        name = name or f"t-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
        url: str = sqs.create_queue(QueueName=name, Attributes={**(FIFO if fifo else {}), **attributes})[
            "QueueUrl"
        ]
        made.append(url)
        return url

    yield make
    for url in made:
        with contextlib.suppress(sqs.exceptions.QueueDoesNotExist):  # the test deleted it
            sqs.delete_queue(QueueUrl=url)


def error_of(call: Callable[[], object]) -> dict[str, str]:
    with pytest.raises(ClientError) as caught:
        call()
    error: dict[str, str] = caught.value.response["Error"]
    return error


def send(sqs: SQSClient, url: str, body: str, group: str = "A", dedup: str | None = None, **more: Any) -> Any:
    return sqs.send_message(
        QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=dedup or body, **more
    )


def receive(sqs: SQSClient, url: str, **more: Any) -> list[dict[str, Any]]:
    more.setdefault("MaxNumberOfMessages", 10)
    messages: list[dict[str, Any]] = sqs.receive_message(QueueUrl=url, **more).get("Messages", [])
    return messages


def depth(sqs: SQSClient, url: str) -> tuple[int, int]:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])


# -- checksums -------------------------------------------------------------------------------


def test_checksums_are_sqs_s_as_moto_computes_them(
    sqs: SQSClient, make_queue: MakeQueue, moto_srv: MotoServer
) -> None:
    """The MD5s of body and attributes, checked against an independent implementation: moto's."""
    url = make_queue()
    body = "héllo \U0001f600 wörld"
    sent = send(sqs, url, body, dedup="checksums", MessageAttributes=ATTRIBUTES)
    moto = client_for(moto_srv.url)
    try:
        moto_url = moto.create_queue(QueueName=f"md5-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        expected = moto.send_message(QueueUrl=moto_url, MessageBody=body, MessageAttributes=ATTRIBUTES)
    finally:
        moto.close()

    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == expected["MD5OfMessageAttributes"]
    (got,) = receive(sqs, url, MessageAttributeNames=["All"])
    assert got["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert got["MessageAttributes"] == ATTRIBUTES


def test_attributes_are_filtered_by_name_and_prefix(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue()
    send(sqs, url, "a", MessageAttributes=ATTRIBUTES)
    (got,) = receive(sqs, url, MessageAttributeNames=["tenant", "ki.*", "kind.*"], VisibilityTimeout=0)
    assert set(got["MessageAttributes"]) == {"tenant"}
    (got,) = receive(sqs, url, MessageAttributeNames=["attempt"], VisibilityTimeout=0)
    assert got["MessageAttributes"] == {"attempt": ATTRIBUTES["attempt"]}
    (plain,) = receive(sqs, url)
    assert "MessageAttributes" not in plain
    assert "MD5OfMessageAttributes" not in plain


# -- errors ----------------------------------------------------------------------------------


def test_a_missing_queue_is_sqs_s_error_and_botocore_s_exception(sqs: SQSClient) -> None:
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as caught:
        sqs.get_queue_url(QueueName="no-such-queue")
    assert caught.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    missing = "http://127.0.0.1:1/123456789012/no-such-queue"
    assert error_of(lambda: sqs.receive_message(QueueUrl=missing))["QueryErrorCode"] == "QueueDoesNotExist"


def test_parameter_errors_name_the_parameter(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue()
    too_many = error_of(lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11))
    assert too_many["Code"] == "InvalidParameterValue"
    assert "MaxNumberOfMessages" in too_many["Message"]
    no_group = error_of(lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="1"))
    assert no_group["Code"] == "MissingParameter"
    assert "MessageGroupId" in no_group["Message"]
    no_dedup = error_of(lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="A"))
    assert no_dedup["Code"] == "InvalidParameterValue"
    assert "ContentBasedDeduplication" in no_dedup["Message"]
    long_wait = error_of(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=21))
    assert long_wait["Code"] == "InvalidParameterValue"
    bad_body = error_of(lambda: send(sqs, url, "nul \x00"))
    assert bad_body["Code"] == "InvalidMessageContents"


def test_receipt_handle_errors(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue(VisibilityTimeout="30")
    garbage = error_of(lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle"))
    assert garbage["Code"] == "ReceiptHandleIsInvalid"

    send(sqs, url, "a")
    (message,) = receive(sqs, url)
    handle = message["ReceiptHandle"]
    other = make_queue()
    assert error_of(lambda: sqs.delete_message(QueueUrl=other, ReceiptHandle=handle))["Code"] == (
        "ReceiptHandleIsInvalid"
    )
    # Handed back: in a FIFO queue the handle has expired with its visibility.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    expired = error_of(lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle=handle))
    assert expired["Code"] == "InvalidParameterValue"
    assert "expired" in expired["Message"]
    assert depth(sqs, url) == (1, 0)


def test_queue_errors(sqs: SQSClient, make_queue: MakeQueue) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}.fifo"
    make_queue(name=name, VisibilityTimeout="30")
    assert sqs.create_queue(QueueName=name, Attributes={**FIFO, "VisibilityTimeout": "30"})["QueueUrl"]
    conflict = error_of(
        lambda: sqs.create_queue(QueueName=name, Attributes={**FIFO, "VisibilityTimeout": "31"})
    )
    assert conflict["Code"] == "QueueAlreadyExists"
    not_fifo = error_of(lambda: sqs.create_queue(QueueName="plain.fifo"))
    assert not_fifo["Code"] == "InvalidParameterValue"
    unknown = error_of(lambda: sqs.create_queue(QueueName="q1", Attributes={"Colour": "blue"}))
    assert unknown["Code"] == "InvalidAttributeName"
    out_of_range = error_of(lambda: sqs.create_queue(QueueName="q2", Attributes={"VisibilityTimeout": "-1"}))
    assert out_of_range["Code"] == "InvalidAttributeValue"
    assert "VisibilityTimeout" in out_of_range["Message"]


def test_batch_errors_are_the_call_s_or_the_entry_s(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue()
    empty = error_of(lambda: sqs.send_message_batch(QueueUrl=url, Entries=[]))
    assert empty["Code"] == "AWS.SimpleQueueService.EmptyBatchRequest"
    twice = [{"Id": "1", "MessageBody": "a", "MessageGroupId": "A", "MessageDeduplicationId": "a"}] * 2
    assert error_of(lambda: sqs.send_message_batch(QueueUrl=url, Entries=twice))["Code"] == (
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    )
    eleven = [
        {"Id": str(i), "MessageBody": "a", "MessageGroupId": "A", "MessageDeduplicationId": str(i)}
        for i in range(11)
    ]
    assert error_of(lambda: sqs.send_message_batch(QueueUrl=url, Entries=eleven))["Code"] == (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    )

    response = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "MessageBody": "a", "MessageGroupId": "A", "MessageDeduplicationId": "a"},
            {"Id": "bad", "MessageBody": "b", "MessageDeduplicationId": "b"},
        ],
    )
    assert [e["Id"] for e in response["Successful"]] == ["ok"]
    assert response["Successful"][0]["MD5OfMessageBody"] == hashlib.md5(b"a").hexdigest()
    (failed,) = response["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == ("bad", "MissingParameter", True)

    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "x", "ReceiptHandle": "garbage"}])
    assert deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"


# -- attributes ------------------------------------------------------------------------------


def test_fairpost_s_queue_set_up_finds_what_it_wants(sqs: SQSClient) -> None:
    settings = load_settings(queue_name=f"fairpost-{uuid.uuid4().hex[:8]}.fifo")
    url, differ = init_queue(sqs, settings)
    try:
        assert differ == {}
        assert init_queue(sqs, settings) == (url, {})  # idempotent: found, not created again
    finally:
        sqs.delete_queue(QueueUrl=url)


def test_queue_attributes(sqs: SQSClient, make_queue: MakeQueue) -> None:
    dead = make_queue()
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    assert dead_arn == f"arn:aws:sqs:us-east-1:123456789012:{dead.rsplit('/', 1)[1]}"
    url = make_queue(
        VisibilityTimeout="7",
        DelaySeconds="0",
        RedrivePolicy=json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": "5"}),
    )
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "7"
    assert json.loads(attrs["RedrivePolicy"]) == {"deadLetterTargetArn": dead_arn, "maxReceiveCount": 5}
    assert (attrs["FifoQueue"], attrs["DeduplicationScope"], attrs["FifoThroughputLimit"]) == (
        "true",
        "queue",
        "perQueue",
    )

    send(sqs, url, "a")
    send(sqs, url, "b", group="B")
    receive(sqs, url, MaxNumberOfMessages=1)
    assert depth(sqs, url) == (1, 1)

    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "0", "RedrivePolicy": ""})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "0"
    assert "RedrivePolicy" not in attrs
    receive(sqs, url)  # at the queue's visibility 0, what it takes stays visible
    assert depth(sqs, url) == (1, 1)


def test_message_attributes_sqs_sets(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue()
    sent = send(sqs, url, "a", group="G", dedup="d-1")
    before_ms = int(time.time() * 1000)
    (first,) = receive(sqs, url, MessageSystemAttributeNames=["All"], VisibilityTimeout=0)
    (second,) = receive(sqs, url, AttributeNames=["ApproximateReceiveCount", "MessageGroupId"])

    attrs = first["Attributes"]
    assert attrs["MessageGroupId"] == "G"
    assert attrs["MessageDeduplicationId"] == "d-1"
    assert attrs["SequenceNumber"] == sent["SequenceNumber"]
    assert attrs["ApproximateReceiveCount"] == "1"
    assert int(attrs["SentTimestamp"]) <= int(attrs["ApproximateFirstReceiveTimestamp"])
    assert abs(int(attrs["SentTimestamp"]) - before_ms) < 60_000
    assert second["Attributes"] == {"ApproximateReceiveCount": "2", "MessageGroupId": "G"}
    assert second["ReceiptHandle"] != first["ReceiptHandle"]


def test_dedup_scope_message_group_keeps_ids_apart(sqs: SQSClient, make_queue: MakeQueue) -> None:
    per_group = make_queue(DeduplicationScope="messageGroup", FifoThroughputLimit="perMessageGroupId")
    per_queue = make_queue()
    for url in (per_group, per_queue):
        first = send(sqs, url, "a", group="A", dedup="same")
        again = send(sqs, url, "a", group="A", dedup="same")
        assert again["MessageId"] == first["MessageId"]
        send(sqs, url, "b", group="B", dedup="same")
    assert len(receive(sqs, per_group)) == 2
    assert len(receive(sqs, per_queue)) == 1


def test_any_message_in_flight_holds_its_group(sqs: SQSClient, make_queue: MakeQueue) -> None:
    """Not only the head: a head handed back waits while a later message of its group is in flight."""
    url = make_queue(VisibilityTimeout="30")
    for body in ("A-0", "A-1", "A-2"):
        send(sqs, url, body)
    head, second, third = receive(sqs, url)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=head["ReceiptHandle"], VisibilityTimeout=0)
    assert receive(sqs, url) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert receive(sqs, url) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    assert [m["Body"] for m in receive(sqs, url)] == ["A-0"]


def test_a_deep_group_does_not_starve_the_others(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue(VisibilityTimeout="30")
    for start in range(0, 30, 10):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": f"A-{i}",
                    "MessageGroupId": "A",
                    "MessageDeduplicationId": f"A-{i}",
                }
                for i in range(start, start + 10)
            ],
        )
    send(sqs, url, "B-0", group="B")

    first = receive(sqs, url)
    assert [m["Body"] for m in first] == [f"A-{i}" for i in range(10)]  # as much of one group as fits
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(first)],
    )
    second = [m["Body"] for m in receive(sqs, url)]
    assert second[0] == "B-0"  # the group served longest ago first
    assert second[1:] == [f"A-{i}" for i in range(10, 19)]


def test_a_standard_queue(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=False, VisibilityTimeout="30")
    sqs.send_message(QueueUrl=url, MessageBody="a")
    sqs.send_message(QueueUrl=url, MessageBody="a")  # no deduplication
    dedup = error_of(lambda: sqs.send_message(QueueUrl=url, MessageBody="a", MessageDeduplicationId="x"))
    assert dedup["Code"] == "InvalidParameterValue"
    first, second = receive(sqs, url, AttributeNames=["All"])
    assert "SequenceNumber" not in first["Attributes"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    not_in_flight = error_of(
        lambda: sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5
        )
    )
    assert not_in_flight["Code"] == "AWS.SimpleQueueService.MessageNotInflight"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert depth(sqs, url) == (1, 0)


def test_purge_and_list(sqs: SQSClient, make_queue: MakeQueue) -> None:
    prefix = f"list{uuid.uuid4().hex[:6]}"
    urls = [make_queue(name=f"{prefix}-{i}.fifo") for i in range(3)]
    assert sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"] == urls
    page = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2)
    assert page["QueueUrls"] == urls[:2]
    rest = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2, NextToken=page["NextToken"])
    assert rest["QueueUrls"] == urls[2:]
    send(sqs, urls[0], "a")
    sqs.purge_queue(QueueUrl=urls[0])
    assert depth(sqs, urls[0]) == (0, 0)


# -- receiving -------------------------------------------------------------------------------


def test_a_retried_receive_gets_the_same_messages_back(sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue(VisibilityTimeout="30")
    for body in ("a", "b"):
        send(sqs, url, body)
    first = receive(sqs, url, ReceiveRequestAttemptId="attempt-1")
    again = receive(sqs, url, ReceiveRequestAttemptId="attempt-1")
    assert [(m["Body"], m["ReceiptHandle"]) for m in again] == [
        (m["Body"], m["ReceiptHandle"]) for m in first
    ]
    assert receive(sqs, url, ReceiveRequestAttemptId="attempt-2") == []

    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    # One of its messages changed: the retry is an ordinary receive (the group is still held).
    assert receive(sqs, url, ReceiveRequestAttemptId="attempt-1") == []


def test_redrive_moves_a_message_after_max_receive_count(sqs: SQSClient, make_queue: MakeQueue) -> None:
    dead = make_queue()
    arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = make_queue(RedrivePolicy=json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2}))
    send(sqs, url, "a")
    send(sqs, url, "b")
    for count in ("1", "2"):
        got = receive(sqs, url, MaxNumberOfMessages=1, VisibilityTimeout=0, AttributeNames=["All"])
        assert [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in got] == [("a", count)]
    # The third receive moves "a" to the dead-letter queue and delivers what follows it.
    assert [m["Body"] for m in receive(sqs, url, MaxNumberOfMessages=1)] == ["b"]
    (moved,) = receive(sqs, dead, AttributeNames=["All"])
    assert moved["Body"] == "a"
    assert moved["Attributes"]["DeadLetterQueueSourceArn"].endswith(url.rsplit("/", 1)[1])


def test_an_idle_long_poll_uses_no_cpu(sqs: SQSClient, make_queue: MakeQueue) -> None:
    """The server's poll waits on a condition variable: over a 2 s poll on an empty queue
    the whole test process (server threads included) uses a sliver of CPU time, where a
    poll that rescans the queue in a loop would use most of a core (moto's: about 2 s)."""
    url = make_queue()
    cpu_before = time.process_time()
    started = time.monotonic()
    assert receive(sqs, url, WaitTimeSeconds=2) == []
    waited = time.monotonic() - started
    cpu = time.process_time() - cpu_before
    assert waited >= 1.9, f"the poll returned after {waited:.2f}s, not after its 2 s wait"
    assert cpu < 0.1, f"an idle 2 s long poll cost {cpu:.3f}s of CPU"


def polling(sqs: SQSClient, url: str, **more: Any) -> tuple[threading.Thread, list[list[dict[str, Any]]]]:
    """A long poll in a thread; its result lands in the returned list."""
    result: list[list[dict[str, Any]]] = []
    thread = threading.Thread(target=lambda: result.append(receive(sqs, url, **more)), daemon=True)
    thread.start()
    return thread, result


def receives_open(server: SqsServer, count: int) -> None:
    wait_for(lambda: server.requests().get("ReceiveMessage", 0) >= count, within=5, what="the poll to open")


def test_a_long_poll_wakes_for_a_send(fifo_sqs_srv: SqsServer, sqs: SQSClient, make_queue: MakeQueue) -> None:
    url = make_queue()
    opened = fifo_sqs_srv.requests().get("ReceiveMessage", 0)
    thread, result = polling(sqs, url, WaitTimeSeconds=20)
    receives_open(fifo_sqs_srv, opened + 1)
    send(sqs, url, "a")
    thread.join(timeout=10)  # well before the poll's 20 s
    assert not thread.is_alive(), "the poll was not woken by the send"
    assert [m["Body"] for m in result[0]] == ["a"]


def test_a_long_poll_wakes_when_a_message_becomes_visible(
    fifo_sqs_srv: SqsServer, sqs: SQSClient, make_queue: MakeQueue
) -> None:
    url = make_queue()
    send(sqs, url, "a")
    send(sqs, url, "b")
    _head, rest = receive(sqs, url, VisibilityTimeout=1)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=rest["ReceiptHandle"], VisibilityTimeout=0)
    opened = fifo_sqs_srv.requests().get("ReceiveMessage", 0)
    thread, result = polling(sqs, url, WaitTimeSeconds=20)
    receives_open(fifo_sqs_srv, opened + 1)
    thread.join(timeout=10)  # the head's 1 s timeout ends the hold, well before the poll's 20 s
    assert not thread.is_alive(), "the poll was not woken when the group's head became visible"
    assert [m["Body"] for m in result[0]] == ["a", "b"]


def test_a_poll_whose_client_left_still_takes_its_messages(
    fifo_sqs_srv: SqsServer, sqs: SQSClient, make_queue: MakeQueue
) -> None:
    """As SQS does: the poll runs on on the server and hides what it takes for the
    visibility timeout (tests/e2e/test_shutdown_polls.py relies on this)."""
    url = make_queue(VisibilityTimeout="30")
    body = json.dumps({"QueueUrl": url, "WaitTimeSeconds": 20, "MaxNumberOfMessages": 10}).encode()
    opened = fifo_sqs_srv.requests().get("ReceiveMessage", 0)
    with socket.create_connection(("127.0.0.1", fifo_sqs_srv.port)) as raw:
        raw.sendall(
            b"POST / HTTP/1.1\r\nHost: sqs\r\nContent-Type: application/x-amz-json-1.0\r\n"
            b"X-Amz-Target: AmazonSQS.ReceiveMessage\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        receives_open(fifo_sqs_srv, opened + 1)
    send(sqs, url, "a")
    wait_for(lambda: depth(sqs, url) == (0, 1), within=10, what="the abandoned poll to take the message")
    assert receive(sqs, url) == []


def test_reset_forgets_queues_and_ends_polls_on_them() -> None:
    with SqsServer() as server:
        sqs = client_for(server.url)
        try:
            url = sqs.create_queue(QueueName="q.fifo", Attributes=FIFO)["QueueUrl"]
            errors: list[str] = []

            def poll() -> None:
                try:
                    receive(sqs, url, WaitTimeSeconds=20)
                except ClientError as exc:
                    errors.append(exc.response["Error"]["Code"])

            thread = threading.Thread(target=poll, daemon=True)
            thread.start()
            receives_open(server, 1)
            server.reset()
            thread.join(timeout=10)
            assert errors == ["AWS.SimpleQueueService.NonExistentQueue"]
            assert server.broker.queue_names() == []
            assert server.errors == []
        finally:
            sqs.close()


async def test_aiobotocore_speaks_to_it(fifo_sqs_srv: SqsServer, make_queue: MakeQueue) -> None:
    """The daemon's client: aiobotocore, whose response parsing is its own."""
    url = make_queue()
    session = aioboto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    async with session.client("sqs", endpoint_url=fifo_sqs_srv.url, region_name="us-east-1") as sqs:
        await sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": f"m{i}",
                    "MessageGroupId": "A",
                    "MessageDeduplicationId": str(i),
                }
                for i in range(3)
            ],
        )
        response = await sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["MessageGroupId"],
        )
        assert [m["Body"] for m in response["Messages"]] == ["m0", "m1", "m2"]
        with pytest.raises(ClientError) as caught:
            await sqs.get_queue_url(QueueName="absent")
        assert caught.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
