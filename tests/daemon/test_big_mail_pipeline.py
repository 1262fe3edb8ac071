"""Mail to more recipients than the tenant's per-second limit, end to end (issue 12, item 3).

SDK → Redis → dispatcher → SQS (moto, over HTTP) → quota → the recording SES.
At the default tenant limit of 5/second, a mail to 10 people used to end as a
dead letter (``too_many_recipients``); it must be sent, alone in its second,
and counted in full.
"""

from __future__ import annotations

import pytest

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings

# Every test here runs against moto (SQS) and the recording SES.
pytestmark = pytest.mark.usefixtures("ses_env")


def mail(i: int, recipients: int) -> Mail:
    return Mail(
        sender="app@example.com",
        to=[f"user{i}.{r}@example.org" for r in range(recipients)],
        subject=f"m{i}",
        text="hi",
    )


async def test_mail_to_ten_people_at_five_a_second_is_sent_not_dead_lettered(
    redis_url: str, ses: SesServer
) -> None:
    settings = quick_settings(redis_url, tenant_limits="5/second; 10000/day")
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        ids = await client.send_many("acme", [mail(i, 10) for i in range(3)] + [mail(9, 2)])

        async def all_ended() -> bool:
            states = [(await client.status(i)).state for i in ids]
            return all(state in (JobState.SENT, JobState.DEAD) for state in states)

        await wait_for_async(all_ended, within=30, what="every mail to end")
        states = [(await client.status(i)).state for i in ids]
        used = await run.quota.usage("acme", settings.limits_for("acme"))
    assert states == [JobState.SENT] * 4
    # Each big mail went alone: no second held more than max(limit, largest mail).
    assert ses.max_in_window(1.0) <= 10
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(ids)
    assert dict(used)[settings.limits_for("acme")[1]] == 32  # counted in full


async def test_a_mail_a_lowered_budget_can_never_hold_is_dead_lettered_naming_the_window(
    redis_url: str, ses: SesServer
) -> None:
    # Enqueued under one limit; the sender runs under a lower one (an operator lowered it).
    before = quick_settings(redis_url, tenant_limits="5/second; 100/hour")
    after = quick_settings(redis_url, tenant_limits="5/second; 6/hour")
    async with AsyncMailClient(before) as client:
        big, small = await client.send_many("acme", [mail(1, 8), mail(2, 1)])
        async with pipeline(after):

            async def both_ended() -> bool:
                states = [(await client.status(i)).state for i in (big, small)]
                return all(state in (JobState.SENT, JobState.DEAD) for state in states)

            await wait_for_async(both_ended, within=30, what="both mails to end")
        status = await client.status(big)
        assert (await client.status(small)).state == JobState.SENT
    assert status.state == JobState.DEAD
    assert "6/hour" in (status.last_error or "") and "tenant" in (status.last_error or "")
