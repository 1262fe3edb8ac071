"""Daemon replicas as real processes on shared emulators, and the application beside them.

The end-to-end runs (tests/e2e) each start two or more ``fairpost run`` processes
on one Redis, one FIFO queue and the recording SES, and send from the SDK as an
application does. What they share is here: the replicas' environment, the
application's settings and queue, an application's retry of a refused send, and
the wait until every accepted job is settled.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest

from fairpost import MailClient, RedisFailed
from fairpost.config import Settings, load_settings
from fairpost.mailer.ops.queue_setup import init_queue
from tests.support.daemon_process import DaemonProcess, daemon_process

T = TypeVar("T")

AWS_TESTING = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}


def replica_env(
    *, ses_url: str, fairpost: Mapping[str, str], sqs_url: str | None = None, aws_url: str | None = None
) -> dict[str, str]:
    """A replica's environment: SES at ``ses_url``, SQS at ``sqs_url`` (or every other
    AWS service at ``aws_url``), and the ``FAIRPOST_*`` settings given."""
    env = {"PATH": "/usr/bin:/bin", **AWS_TESTING, "AWS_ENDPOINT_URL_SESV2": ses_url}
    if aws_url is not None:
        env["AWS_ENDPOINT_URL"] = aws_url
    if sqs_url is not None:
        env["AWS_ENDPOINT_URL_SQS"] = sqs_url
    return {**env, **fairpost}


def application_settings(env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The application's settings: the replicas' ``FAIRPOST_*`` environment."""
    for name, value in env.items():
        if name.startswith("FAIRPOST_"):
            monkeypatch.setenv(name, value)
    return load_settings()


def make_queue(settings: Settings, sqs_url: str) -> None:
    """The mail queue the replicas share, as `fairpost init-aws` makes it."""
    init_queue(boto3.client("sqs", endpoint_url=sqs_url, **_aws_keys()), settings)


def _aws_keys() -> dict[str, Any]:
    return {
        "region_name": AWS_TESTING["AWS_DEFAULT_REGION"],
        "aws_access_key_id": AWS_TESTING["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS_TESTING["AWS_SECRET_ACCESS_KEY"],
    }


@contextlib.contextmanager
def replicas(
    env: Mapping[str, str], log_dir: Path, count: int = 2, *, python: str = sys.executable
) -> Iterator[list[DaemonProcess]]:
    """``count`` replicas (``r1``, ``r2``, ...), each beating before this yields; killed
    at the end if still running. ``python``: another release's (tests/support/release.py)."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(daemon_process(env, log_dir, replica=f"r{i}", python=python))
            for i in range(1, count + 1)
        ]


def stop_cleanly(daemons: list[DaemonProcess]) -> None:
    """Every replica still ran (none gave up on an outage) and stops with exit 0."""
    assert all(d.process.poll() is None for d in daemons), "a daemon gave up"
    codes = [d.stop() for d in daemons]
    assert codes == [0] * len(daemons), f"exit codes {codes}"


def accepted(send: Callable[[], T], within: float = 60.0) -> T:
    """What an application does: retry a refused send (same idempotency keys) until accepted."""
    deadline = time.monotonic() + within
    while True:
        try:
            return send()
        except RedisFailed:  # a connection cut, or a write not on a replica yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def mail(tenant: str, n: int) -> dict[str, Any]:
    """The ``n``-th mail of ``tenant``: a recipient and an idempotency key of its own."""
    return {
        "sender": "app@example.com",
        "to": [f"{tenant}-{n}@example.org"],
        "subject": "s",
        "text": "t",
        "idempotency_key": f"{tenant}-{n}",
    }


def settled(client: MailClient, ids: Collection[str]) -> Callable[[], bool]:
    """A condition: every job of ``ids`` is sent or dead (False while Redis refuses)."""

    def check() -> bool:
        try:
            return all(client.status(i).state in ("sent", "dead") for i in ids)
        except RedisFailed:
            return False

    return check
