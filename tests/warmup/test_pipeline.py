"""The whole pipeline (moto's SQS, the recording SES): a warming tenant's mail goes out at
its step's rate, a held one's at its held step's, and another tenant's is unaffected."""

from __future__ import annotations

import pytest
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.quota.warmup_admin import WarmupAdmin
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_mail import max_in_window_by
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings
from tests.warmup.support import KEYS

pytestmark = pytest.mark.usefixtures("ses_env")

STEP_2_AT = 3.0
"""Seconds into the warming tenant's plan its second step starts."""


def mail(i: int) -> Mail:
    return Mail(sender="app@example.com", to=[f"user{i}@example.org"], subject=f"m{i}", text="hi")


async def test_a_warming_tenant_sends_at_its_steps_rate_and_others_are_unaffected(
    redis_url: str, ses: SesServer, aredis: redis.asyncio.Redis
) -> None:
    # The guard's own thresholds far off: only the warm-up acts on the bounces here.
    settings = quick_settings(redis_url, tenant_limits="20/second", reputation={"bounce_threshold": 0.5})
    with WarmupAdmin(settings) as admin:
        started = admin.set_plan("warm", f"2/second from 0s | 6/second from {STEP_2_AT:.0f}s").started_ms
        admin.set_plan("bouncy", "1/second from 0s | 10/second from 1s")
    await ReputationBook(aredis, KEYS, settings).read("bouncy", sends=10, bounces=5)
    async with pipeline(settings, reputation=True) as run, AsyncMailClient(settings) as client:
        warm = await client.send_many("warm", [mail(i) for i in range(18)])
        other = await client.send_many("other", [mail(i) for i in range(18)])
        bouncy = await client.send_many("bouncy", [mail(i) for i in range(6)])
        seen: set[str | None] = set()

        async def waiting_for(ids: list[str], reason: str) -> bool:
            seen.update([(await client.status(i)).waiting_for for i in ids])
            return reason in seen

        await wait_for_async(
            lambda: waiting_for(warm, "warmup"), within=10, what="warm's mail waiting for its step"
        )
        await wait_for_async(
            lambda: waiting_for(bouncy, "warmup_held"),
            within=10,
            what="bouncy's mail waiting for its held step",
        )

        async def all_sent() -> bool:
            states = [(await client.status(i)).state for i in warm + other + bouncy]
            return all(state == JobState.SENT for state in states)

        await wait_for_async(all_sent, within=40, what="every mail sent")
        assert run.metrics is not None
        throttled = run.metrics.registry.get_sample_value(
            "fairpost_mail_throttled_total", {"tenant": "bouncy", "reason": "warmup_held"}
        )
        assert throttled is not None and throttled >= 1

    def per_second(tenant: str, start: float = 0.0, end: float = float("inf")) -> int:
        """Most of the tenant's recipients SES took in any second, among those sent between
        ``start`` and ``end`` seconds into the warming tenant's plan."""
        mails = [
            m
            for m in ses.sent
            if m.tag("fairpost-tenant") == tenant and start <= m.wall_time - started / 1000 < end
        ]
        return max_in_window_by(mails, 1.0, key=lambda m: tenant).get(tenant, 0)

    by_tenant = ses.max_in_window_by(1.0, key=lambda m: m.tag("fairpost-tenant"))
    # Never above its step: 2 a second on the first, 6 on the second (a margin of 50 ms
    # for the clocks: Redis's started_ms against SES's wall clock, on one machine).
    assert per_second("warm", end=STEP_2_AT - 0.05) <= 2, by_tenant
    assert by_tenant["warm"] <= 6, by_tenant
    # ... and at it: the second step's rate is used.
    assert per_second("warm", start=STEP_2_AT) >= 4, by_tenant
    # The held tenant stays on its first step (1 a second), its bounces being over 2 %.
    assert by_tenant["bouncy"] <= 1, by_tenant
    # The tenant with no plan sends at its own limits (20 a second), well above any step.
    assert by_tenant["other"] >= 10, by_tenant
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(warm + other + bouncy)
