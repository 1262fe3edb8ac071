"""A Redis error while a slow SES call is kept counted must not abandon the call.

While SES takes its time, the sender moves the mail's quota units forward
(fairpost.mailer.daemon.counting). If one of those moves fails, the call is still
SES's: its answer must be awaited and recorded, or the mail's message comes back
unrecorded and SES gets the same mail twice.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.testing.ses_server import SesServer
from tests.daemon.test_sender_once import send_one_until_recorded
from tests.support.pipeline import pipeline, quick_settings


async def test_a_redis_error_keeping_a_slow_call_counted_sends_it_once(
    redis_url: str, ses_env: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ses = ses_env
    ses.latency = 2.0  # SES takes the mail at once and answers 2 s later
    # 1000/second: a mail in a call is kept counted every half second, several times a call.
    settings = quick_settings(redis_url, sender={"wait_seconds": 1, "visibility_timeout": 5, "receivers": 1})

    # A mock of the one Redis call the keep makes (a restamp, outside a pipeline):
    # it fails once, while SES holds the mail and has not answered yet.
    injected: list[str] = []
    real = QuotaEngine.restamp

    async def restamp(self: QuotaEngine, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("pipeline") is None and ses.sent and not injected:
            injected.append("restamp")
            raise RedisConnectionError("Connection reset by peer (injected while SES holds the call)")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(QuotaEngine, "restamp", restamp)
    async with pipeline(settings) as run:
        job_id = await send_one_until_recorded(run, within=40)
    assert injected == ["restamp"], "the keep never failed during the call"
    assert [m.job_id for m in ses.sent] == [job_id]
