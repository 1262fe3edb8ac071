"""An exception nobody listed, from one tenant's mail, takes no replica down (issue 27, build 4).

The real pipeline (moto's SQS, the recording SES, a real redis-server); the bug is
injected into the group decision of one tenant (a mock of a defect, said so here):
once, then the mail goes out on the retry; for ever, then that mail ends a dead
letter naming what failed, and every other tenant's mail goes out meanwhile.
"""

from __future__ import annotations

from typing import Any

import pytest

from fairpost import AsyncMailClient
from fairpost.mailer.daemon.group import GroupDecision
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings


class Bug:
    """GroupDecision.handle, failing ``times`` times for tenant ``buggy`` with an error no
    handler lists (None: every time)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, times: int | None) -> None:
        self.raised = 0
        real = GroupDecision.handle

        async def handle(decision: GroupDecision, tenant: str, group: list[Any]) -> None:
            if tenant == "buggy" and (times is None or self.raised < times):
                self.raised += 1
                raise LookupError("a defect in the group decision")
            await real(decision, tenant, group)

        monkeypatch.setattr(GroupDecision, "handle", handle)


async def send(client: AsyncMailClient, tenant: str) -> str:
    return await client.send(tenant, sender="app@example.com", to=["a@example.org"], subject="s", text="t")


async def test_a_bug_met_once_is_retried_and_the_mail_sent(
    redis_url: str, ses_env: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    bug = Bug(monkeypatch, times=1)
    settings = quick_settings(redis_url)
    async with pipeline(settings), AsyncMailClient(settings) as client:
        job = await send(client, "buggy")

        async def sent() -> bool:
            return (await client.status(job)).state == "sent"

        await wait_for_async(sent, within=30, what="the mail sent on the retry after the bug")
    assert bug.raised == 1
    assert [m.job_id for m in ses_env.sent] == [job]


async def test_a_bug_met_every_time_ends_that_mail_dead_and_spares_the_others(
    redis_url: str, ses_env: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    Bug(monkeypatch, times=None)
    settings = quick_settings(
        redis_url, sender={**quick_settings(redis_url).sender.model_dump(), "max_attempts": 2}
    )
    async with pipeline(settings), AsyncMailClient(settings) as client:
        doomed = await send(client, "buggy")
        fine = [await send(client, "acme") for _ in range(3)]

        async def settled() -> bool:
            states = [(await client.status(j)).state for j in [doomed, *fine]]
            return states == ["dead", "sent", "sent", "sent"]

        await wait_for_async(settled, within=60, what="the buggy mail dead, the others sent")
        status = await client.status(doomed)
    assert "LookupError" in (status.dead_reason or "")
    assert sorted(str(m.job_id) for m in ses_env.sent) == sorted(fine)
