"""The SDK rides out a Redis restart or failover (issue 27, defect 10, build item 3).

A connection refused or cut, an answer that never came, a failover's
``READONLY``/``MOVED``/``CLUSTERDOWN``: the call is tried again, with back-off,
for up to FAIRPOST_REDIS_RETRY_SECONDS, and only then raises ``RedisFailed``.
The job ids are made before the first try, so an enqueue that reached Redis
but whose answer was lost recognises itself when tried again: one job, not two.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis

from fairpost import AsyncMailClient, MailClient, RedisFailed
from fairpost.config import ConfigError, Settings, load_settings
from fairpost.dispatcher.keys import TOTAL_WAITING
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.wait import wait_for, wait_for_async
from tests.support.topologies import SENTINEL_MASTER, Node, redis_sentinel

MAIL: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}
KEYS = MailKeys("fairpost")
T = TypeVar("T")
RIDES_OUT = 60.0
"""FAIRPOST_REDIS_RETRY_SECONDS where the outage must be ridden out: a deadline, not a budget."""


def settings_for(node: Node, **overrides: Any) -> Settings:
    return load_settings(redis_url=f"redis://127.0.0.1:{node.port}/0", redis_connect_timeout=0.5, **overrides)


def jobs_written(node: Node, tenant: str = "acme") -> tuple[int, int, int]:
    """Job records, queue entries and the waiting count: each once per job."""
    with node.client(decode_responses=True) as r:
        records = sum(1 for _ in r.scan_iter(match=KEYS.job("*")))
        entries = r.llen(KEYS.queue(tenant, "normal"))
        waiting = int(r.hget(KEYS.counts(), TOTAL_WAITING) or 0)
    return records, entries, waiting


def retrying(caplog: pytest.LogCaptureFixture) -> bool:
    return any("retrying" in r.getMessage() for r in caplog.records if r.name == "fairpost.sdk")


def through_outage(call: Callable[[], T], caplog: pytest.LogCaptureFixture, end: Callable[[], None]) -> T:
    """``call()`` in a thread of its own while Redis is away; once it is seen trying
    again (or it is done), ``end()`` the outage. Its result; what it raised is raised."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        tried = lambda: retrying(caplog) or not thread.is_alive()  # noqa: E731
        wait_for(tried, within=10, what="the call to fail and retry")
    finally:
        end()
    thread.join(timeout=30)
    assert not thread.is_alive()
    if "error" in result:
        raise result["error"]
    value: T = result["value"]
    return value


def test_a_send_during_a_redis_restart_returns_its_job_id_once_redis_is_back(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    with MailClient(settings_for(node, redis_retry_seconds=RIDES_OUT)) as client:
        # Connected, scripts loaded: the pool holds a connection the restart breaks.
        client.send("warmup", **MAIL)
        node.stop()
        job_id = through_outage(lambda: client.send("acme", **MAIL), caplog, node.start)
    with node.client(decode_responses=True) as r:
        assert r.hget(KEYS.job(job_id), "state") == "queued"
    assert jobs_written(node) == (1, 1, 1)


async def test_the_async_client_rides_out_a_restart_too(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    async with AsyncMailClient(settings_for(node, redis_retry_seconds=RIDES_OUT)) as client:
        await client.send("warmup", **MAIL)
        node.stop()
        sending = asyncio.create_task(client.send("acme", **MAIL))
        try:
            await wait_for_async(lambda: retrying(caplog), within=10, what="the send to fail and retry")
        finally:
            node.start()
        job_id = await asyncio.wait_for(sending, timeout=30)
    with node.client(decode_responses=True) as r:
        assert r.hget(KEYS.job(job_id), "state") == "queued"
    assert jobs_written(node) == (1, 1, 1)


class LosesOneReply(redis.Connection):
    """A mock of the network: the first enqueue script's answer (of one of ``only``'s
    commands; None: any command's) is lost on its way back. Redis ran the command
    (its reply is read off the socket), then the connection breaks as a cut cable
    would break it."""

    armed = False
    lost = 0
    only: tuple[str, ...] | None = ("EVALSHA", "EVAL")

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        only = type(self).only
        self._losable = bool(args) and (only is None or str(args[0]).upper() in only)
        super().send_command(*args, **kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().read_response(*args, **kwargs)
        if type(self).armed and getattr(self, "_losable", False):
            type(self).armed = False
            type(self).lost += 1
            self.disconnect()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            raise redis.ConnectionError("Connection closed by server.")
        return response


@pytest.fixture
def losing(node: Node) -> Iterator[redis.Redis]:
    LosesOneReply.armed, LosesOneReply.lost = False, 0
    pool = redis.ConnectionPool(port=node.port, connection_class=LosesOneReply)
    client = redis.Redis(connection_pool=pool)
    yield client
    client.close()


@pytest.mark.parametrize("idempotency_key", [None, "order-42"])
def test_an_enqueue_whose_answer_was_lost_is_retried_into_one_job(
    node: Node, losing: redis.Redis, idempotency_key: str | None
) -> None:
    with MailClient(settings_for(node, redis_retry_seconds=RIDES_OUT), redis_client=losing) as client:
        LosesOneReply.armed = True
        job_id = client.send("acme", idempotency_key=idempotency_key, **MAIL)
        assert LosesOneReply.lost == 1, "the network mock did not drop the answer"
        assert client.status(job_id).state == "queued"
    assert jobs_written(node) == (1, 1, 1)


def test_a_send_many_whose_answer_was_lost_writes_each_mail_once(node: Node, losing: redis.Redis) -> None:
    with MailClient(settings_for(node, redis_retry_seconds=RIDES_OUT), redis_client=losing) as client:
        LosesOneReply.armed = True
        job_ids = client.send_many("acme", [MAIL, MAIL, MAIL])
        assert LosesOneReply.lost == 1
    assert len(set(job_ids)) == 3
    assert jobs_written(node) == (3, 3, 3)


def test_an_outage_longer_than_the_retry_setting_raises_redis_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    # Nothing listens on this port: Redis is down for the whole call.
    settings = load_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_retry_seconds=0.5)
    with MailClient(settings) as client, pytest.raises(RedisFailed) as caught:
        client.send("acme", **MAIL)
    assert retrying(caplog), "it gave up without trying again"
    error = caught.value
    assert error.operation == "enqueue" and not error.may_have_written
    assert "tried" in str(error) and "0.5 s" in str(error)


def test_an_error_that_is_no_outage_is_not_retried(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """Out of memory refuses the script whole: trying again for seconds would not help."""
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    with node.client() as admin:
        admin.config_set("maxmemory", "1")
        admin.config_set("maxmemory-policy", "noeviction")
    with (
        MailClient(settings_for(node, redis_retry_seconds=RIDES_OUT)) as client,
        pytest.raises(RedisFailed) as caught,
    ):
        client.send("acme", **MAIL)
    assert not retrying(caplog)
    assert "refused it" in str(caught.value)


def test_retry_seconds_is_a_setting_with_a_sane_default() -> None:
    assert load_settings().redis_retry_seconds == 10.0
    assert load_settings(redis_retry_seconds=0).redis_retry_seconds == 0
    for bad in (-1, 3601):
        with pytest.raises(ConfigError, match="FAIRPOST_REDIS_RETRY_SECONDS"):
            load_settings(redis_retry_seconds=bad)


@pytest.mark.sentinel
def test_a_send_while_sentinel_fails_over_lands_on_the_new_master() -> None:
    """A master killed: until Sentinel promotes the replica the send meets refused
    connections and no master (or a demoted one's READONLY); it returns once the
    new master takes the write, without the application retrying."""
    with redis_sentinel() as group:
        settings = load_settings(
            redis_url="redis://fairpost-master/0",
            redis_sentinels=group.sentinel_addresses,
            redis_sentinel_master=SENTINEL_MASTER,
            redis_connect_timeout=0.5,
            redis_retry_seconds=RIDES_OUT,
        )
        with MailClient(settings) as client:
            client.send("warmup", **MAIL)
            old = group.current_master()
            old.kill()
            job_id = client.send("acme", **MAIL)
            assert client.status(job_id).state == "queued"
        new = group.current_master()
        assert new is not old
        with new.client(decode_responses=True) as r:
            assert r.hget(KEYS.job(job_id), "state") == "queued"
            assert r.llen(KEYS.queue("acme", "normal")) == 1
