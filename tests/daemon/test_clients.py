"""The daemon's clients to AWS and Redis, as `fairpost run` builds them."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import redis.asyncio.connection
from redis._parsers import _AsyncHiredisParser

from fairpost import AsyncMailClient
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings


@pytest.mark.usefixtures("ses_env")
async def test_the_daemon_names_itself_to_aws(redis_url: str, ses: SesServer) -> None:
    # What AWS support and CloudTrail show as the caller: fairpost and its version,
    # not only the SDK underneath.
    settings = quick_settings(redis_url)
    async with pipeline(settings), AsyncMailClient(settings) as client:
        await client.send("t1", sender="app@example.com", to=["x@example.org"], subject="s", text="t")
        await wait_for_async(lambda: ses.sent_count >= 1, within=30, what="the mail at SES")
    [mail] = ses.sent
    assert mail.user_agent.startswith(f"fairpost/{version('fairpost')} "), mail.user_agent


def test_the_daemons_redis_replies_are_parsed_by_hiredis() -> None:
    # Installed with the daemon's extra; redis-py picks it up by itself. Its
    # pure-Python parser was about a twentieth of a replica's CPU.
    assert redis.asyncio.connection.DefaultParser is _AsyncHiredisParser
