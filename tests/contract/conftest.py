"""Fixtures for the contract suite: one SQS emulator per parameter, a fresh FIFO queue per test.

Servers are the session fixtures of tests/conftest.py (``moto_srv``,
``localstack_srv``, ``fifo_sqs_srv``); LocalStack starts only when the first test that asks for
it runs (deselect those with ``-m "not localstack"``). Each test gets
queues of its own with unique names, deleted afterwards, so no test sees
another's messages and no server needs a reset.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.contract import emulators

# boto3 ships no stubs for its clients; the contract tests use a handful of calls.
SQSClient = Any


@dataclass(frozen=True)
class Emulator:
    name: str
    url: str

    def client(self) -> SQSClient:
        """A new SQS client for this emulator (clients are thread-safe; creating them is not)."""
        return boto3.client(
            "sqs",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=16),
        )


@dataclass(frozen=True)
class FifoQueue:
    """A FIFO queue as fairpost creates it, and the client that made it."""

    emulator: Emulator
    client: SQSClient
    url: str
    visibility_timeout: int


MakeQueue = Callable[..., FifoQueue]


@pytest.fixture(params=emulators())
def fifo_emulator(request: pytest.FixtureRequest) -> Emulator:
    """The emulator under test: moto's server, LocalStack or fairpost's own SQS, all over HTTP."""
    name: str = request.param
    if name == "moto":
        return Emulator(name=name, url=request.getfixturevalue("moto_srv").url)
    if name == "localstack":
        return Emulator(name=name, url=request.getfixturevalue("localstack_srv").url)
    if name == "fifo_sqs":
        return Emulator(name=name, url=request.getfixturevalue("fifo_sqs_srv").url)
    raise ValueError(f"unknown emulator {name!r}")


@pytest.fixture
def sqs(fifo_emulator: Emulator) -> Iterator[SQSClient]:
    client = fifo_emulator.client()
    yield client
    client.close()


@pytest.fixture
def make_fifo_queue(fifo_emulator: Emulator, sqs: SQSClient) -> Iterator[MakeQueue]:
    """Factory: ``make_fifo_queue(visibility_timeout=2)`` creates a fresh FIFO queue, deleted at teardown."""
    created: list[str] = []

    def make(*, visibility_timeout: int = 2) -> FifoQueue:
        name = f"contract-{uuid.uuid4().hex[:16]}.fifo"
        url: str = sqs.create_queue(
            QueueName=name,
            Attributes={
                "FifoQueue": "true",
                "ContentBasedDeduplication": "false",
                "DeduplicationScope": "messageGroup",
                "FifoThroughputLimit": "perMessageGroupId",
                "VisibilityTimeout": str(visibility_timeout),
            },
        )["QueueUrl"]
        created.append(url)
        return FifoQueue(emulator=fifo_emulator, client=sqs, url=url, visibility_timeout=visibility_timeout)

    yield make
    for url in created:
        sqs.delete_queue(QueueUrl=url)


@pytest.fixture
def fifo_queue(make_fifo_queue: MakeQueue) -> FifoQueue:
    """A fresh FIFO queue with a 2 s visibility timeout."""
    return make_fifo_queue()
