"""What binding quotas cost in SQS requests: at most 1.5 per delivered mail.

With a second's and ten seconds' window binding at both scopes, the quota
frees a bucket at a time, and most refusals are waits under two seconds that
the sender times itself. Such a wait must cost no SQS call at all (the
message is still hidden from its receive), and its group stays together
instead of being handed back and received again. (It cost 2.5 requests per
mail: a visibility change per timed wait, a hand-back, a receive again.)"""

from __future__ import annotations

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings

TENANTS = ("a", "b", "c", "d", "e", "f")


async def test_binding_quotas_at_both_scopes_cost_more_than_one_and_a_half_sqs_requests_per_mail(
    redis_url: str, ses_env: SesServer
) -> None:
    ses = ses_env
    settings = quick_settings(
        redis_url,
        global_limits="6/second; 30/10 seconds",
        tenant_limits="2/second; 8/10 seconds",
        inflight_cap=10,
        sender={"wait_seconds": 1, "receivers": 2, "pause_seconds": 1, "max_jitter_seconds": 0.2},
    )
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        ids = []
        for tenant in TENANTS:
            ids += await client.send_many(
                tenant,
                [
                    Mail(sender="app@example.com", to=[f"u{i}@example.org"], subject="s", text="t")
                    for i in range(12)
                ],
            )

        async def all_sent() -> bool:
            states = [(await client.status(i)).state for i in ids]
            return all(s == JobState.SENT for s in states)

        await wait_for_async(all_sent, within=60, what="every mail")
        requests = dict(run.receives.requests)
        asked = list(run.receives.asked)
    assert ses.max_in_window(1.0) <= 6
    assert ses.max_in_window(10.0) <= 30
    per_mail = sum(requests.values()) / len(ids)
    assert per_mail <= 1.5, (per_mail, requests, asked)
