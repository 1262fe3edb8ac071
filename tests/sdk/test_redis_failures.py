"""Redis failures reach the application as fairpost errors that say what happened."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fairpost import AsyncMailClient, DeadLetters, FairpostError, MailClient, RedisFailed, Suppressions
from fairpost.config import load_settings
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.testing.services import RedisServer, free_port, redis_server

MAIL: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}


@pytest.fixture
def stopped_redis() -> Iterator[str]:
    """A redis-server with a password that has stopped answering (SIGSTOP): its URL."""
    server: RedisServer
    with redis_server() as server:
        admin = redis.Redis(port=server.port)
        admin.config_set("requirepass", "hunter2")
        admin.close()
        url = f"redis://:hunter2@127.0.0.1:{server.port}/0"
        with MailClient(load_settings(redis_url=url)) as client:
            client.send("acme", **MAIL)  # connected and scripts loaded: then it stops
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            yield url
        finally:
            os.kill(server.process.pid, signal.SIGCONT)


def test_a_redis_that_stopped_answering_raised_redis_py_errors_into_the_application(
    stopped_redis: str,
) -> None:
    # No retries: one call's timeout, and the error it ends in (retries: test_sdk_retries.py).
    settings = load_settings(redis_url=stopped_redis, redis_timeout=0.5, redis_retry_seconds=0)
    with MailClient(settings) as client:
        started = time.monotonic()
        with pytest.raises(RedisFailed) as caught:
            client.send("acme", **MAIL)
        assert time.monotonic() - started < 5, "the timeout setting was not applied"
        with pytest.raises(RedisFailed) as status:
            client.status("abc")
    error = caught.value
    assert isinstance(error, FairpostError)
    assert error.operation == "enqueue" and error.may_have_written
    text = str(error)
    assert text.startswith("enqueue failed: Redis at redis://:***@127.0.0.1:")
    assert "hunter2" not in text
    assert "did not answer within 0.5 s" in text
    assert "the mail may have been written: retry with the same idempotency key" in text
    assert isinstance(error.__cause__, redis.RedisError)
    assert status.value.operation == "status" and not status.value.may_have_written
    assert "hunter2" not in str(status.value)


def test_a_redis_that_refused_connections_raised_redis_py_errors_into_the_application() -> None:
    settings = load_settings(redis_url=f"redis://:hunter2@127.0.0.1:{free_port()}/0", redis_retry_seconds=0)
    with MailClient(settings) as client, pytest.raises(RedisFailed) as caught:
        client.send_many("acme", [MAIL, MAIL])
    error = caught.value
    assert error.operation == "enqueue" and not error.may_have_written
    assert "nothing was written" in str(error) and "hunter2" not in str(error)
    assert "could not connect" in str(error)


async def test_the_async_client_raised_redis_py_errors_too(stopped_redis: str) -> None:
    settings = load_settings(redis_url=stopped_redis, redis_timeout=0.5, redis_retry_seconds=0)
    async with AsyncMailClient(settings) as client:
        with pytest.raises(RedisFailed) as caught:
            await client.send("acme", **MAIL)
        with pytest.raises(RedisFailed) as cancel:
            await client.cancel("abc")
    assert caught.value.operation == "enqueue" and caught.value.may_have_written
    assert cancel.value.operation == "cancel"


def test_redis_timeouts_are_settings_with_sane_defaults() -> None:
    settings = load_settings()
    assert settings.redis_timeout == 5.0
    assert settings.redis_connect_timeout == 2.0


def test_the_admin_clients_raise_redis_failed_too(stopped_redis: str) -> None:
    """DeadLetters, Suppressions and QuotaAdmin fail the way MailClient does: RedisFailed
    naming the operation, the masked URL, and whether a write may have been done.
    No retries: the error is what is checked here (their retries: test_sdk_retry_admin.py)."""
    settings = load_settings(redis_url=stopped_redis, redis_timeout=0.5, redis_retry_seconds=0)
    with DeadLetters(settings) as dead, pytest.raises(RedisFailed) as listing:
        dead.list()
    assert listing.value.operation == "dead letters: list" and not listing.value.may_have_written
    with Suppressions(settings) as lists, pytest.raises(RedisFailed) as adding:
        lists.add("acme", "ada@example.org")
    assert adding.value.operation == "suppression: add" and adding.value.may_have_written
    assert "check before retrying" in str(adding.value)
    assert "ada@example.org" not in str(adding.value) and "hunter2" not in str(adding.value)
    with QuotaAdmin(settings) as admin, pytest.raises(RedisFailed) as pausing:
        admin.pause("acme")
    assert pausing.value.operation == "quota: pause" and pausing.value.may_have_written
    assert isinstance(pausing.value.__cause__, redis.RedisError)


def test_an_admin_write_that_never_reached_redis_did_nothing() -> None:
    # No retries: what the error says is checked, not how long the admin tries.
    settings = load_settings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_connect_timeout=1, redis_retry_seconds=0
    )
    with QuotaAdmin(settings) as admin, pytest.raises(RedisFailed) as pausing:
        admin.pause("acme")
    assert not pausing.value.may_have_written
    assert "nothing was written: retrying is safe" in str(pausing.value)
