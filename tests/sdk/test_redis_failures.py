"""Redis failures reach the application as fairpost errors that say what happened."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from config import load_settings
from mailer import AsyncMailClient, FairpostError, MailClient, RedisFailed
from mailer.testing.services import RedisServer, free_port, redis_server

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
    settings = load_settings(redis_url=stopped_redis, redis_timeout=0.5)
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
    settings = load_settings(redis_url=f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    with MailClient(settings) as client, pytest.raises(RedisFailed) as caught:
        client.send_many("acme", [MAIL, MAIL])
    error = caught.value
    assert error.operation == "enqueue" and not error.may_have_written
    assert "nothing was written" in str(error) and "hunter2" not in str(error)
    assert "could not connect" in str(error)


async def test_the_async_client_raised_redis_py_errors_too(stopped_redis: str) -> None:
    settings = load_settings(redis_url=stopped_redis, redis_timeout=0.5)
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
