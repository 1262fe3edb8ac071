"""A mail is never sent twice without a crash.

SES's answer is recorded before the message can come back (a Redis blip
while recording is ridden out), and a send that outlives its message's
visibility keeps the message hidden and its sending marker held, so that no
receiver (this replica's other loop, another replica) sends it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.client
from redis.exceptions import ConnectionError as RedisConnectionError

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.daemon.test_sender import queue_is_empty
from tests.support.pipeline import Running, pipeline, quick_settings


class RedisBlip:
    """Once armed, the pipelines that record a sent job fail with a connection error
    ``times`` times: what a client sees while Redis fails over or the network drops."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, times: int) -> None:
        self.armed = False
        self.left = times
        real = redis.asyncio.client.Pipeline.execute

        async def execute(pipe: Any, *args: Any, **kwargs: Any) -> Any:
            records_sent = any("sent" in (str(a) for a in args) for args, _ in pipe.command_stack)
            if self.armed and self.left > 0 and records_sent:
                self.left -= 1
                raise RedisConnectionError("Connection reset by peer (a blip, injected)")
            return await real(pipe, *args, **kwargs)

        monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", execute)


async def send_one_until_recorded(run: Running, *, within: float) -> str:
    """Send one mail of tenant acme; its id, once it is recorded sent and its message deleted."""
    async with AsyncMailClient(run.settings) as client:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t"
        )

        async def done() -> bool:
            return (await client.status(job_id)).state == JobState.SENT and queue_is_empty(run.queue_url)

        await wait_for_async(done, within=within, what="the mail recorded sent and its message deleted")
    return job_id


@pytest.fixture
def blip(monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisBlip]:
    yield RedisBlip(monkeypatch, times=3)


async def test_a_redis_blip_while_recording_an_answer_sent_the_mail_again(
    redis_url: str, ses_env: SesServer, blip: RedisBlip
) -> None:
    ses = ses_env
    settings = quick_settings(redis_url, sender={"wait_seconds": 1, "visibility_timeout": 5, "receivers": 1})

    def accept_then_blip(_mail: Any) -> bool:
        # SES has the mail; Redis fails right when the sender records it.
        blip.armed = True
        return False

    ses.fail_when(accept_then_blip, Faults.MESSAGE_REJECTED)  # never answered: the predicate says no
    async with pipeline(settings) as run:
        job_id = await send_one_until_recorded(run, within=30)
    assert blip.left == 0, "the blip never happened"
    assert [m.job_id for m in ses.sent] == [job_id]


async def test_a_send_slower_than_its_visibility_was_sent_twice(redis_url: str, ses_env: SesServer) -> None:
    ses = ses_env
    ses.latency = 8.0  # SES takes the mail at once and answers after 8 s
    settings = quick_settings(redis_url, sender={"wait_seconds": 1, "visibility_timeout": 5, "receivers": 2})
    async with pipeline(settings) as run:
        job_id = await send_one_until_recorded(run, within=40)
        receptions = sum(1 for _, body in run.receives.bodies if job_id in body)
    assert [m.job_id for m in ses.sent] == [job_id]
    assert receptions == 1, "its message came back while it was being sent"


async def test_a_redis_that_lost_its_scripts_while_a_mail_was_sent_records_it_once(
    redis_url: str, ses_env: SesServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The record's pipeline skips SCRIPT EXISTS once its scripts ran
    # (fairpost.mailer.daemon.loaded_scripts); a server that lost them meanwhile (a
    # restart, a failover) answers NOSCRIPT, and the record is written all the same.
    ses = ses_env
    settings = quick_settings(redis_url, sender={"wait_seconds": 1, "visibility_timeout": 5, "receivers": 1})
    flushed: list[str] = []

    def flush_then_accept(mail: Any) -> bool:
        if flushed == ["armed"]:
            with redis.Redis.from_url(redis_url) as client:
                client.script_flush()
            flushed[0] = "flushed"
        return False

    ses.fail_when(flush_then_accept, Faults.MESSAGE_REJECTED)  # never answered: the predicate says no
    async with pipeline(settings) as run:
        first = await send_one_until_recorded(run, within=30)
        flushed.append("armed")
        second = await send_one_until_recorded(run, within=30)
    assert flushed == ["flushed"]
    assert any("NoScriptError" in r.getMessage() for r in caplog.records), "the record never met NOSCRIPT"
    assert [m.job_id for m in ses.sent] == [first, second]
