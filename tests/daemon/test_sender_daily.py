"""SES says the account's daily quota is spent: the sender holds until the day can free.

Throttling that says "Daily message quota exceeded" is no rate burst that a
moment's back-off cures: the sender reads the account again (GetAccount) and
holds sending until the day window can free (or it looks at the account
again), instead of retrying every 0.5 to 30 seconds for hours.
"""

from __future__ import annotations

from fairpost import AsyncMailClient
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings


async def test_a_spent_daily_quota_was_retried_in_a_backoff_loop(redis_url: str, ses_env: SesServer) -> None:
    ses = ses_env
    ses.set_quota(max_24_hour_send=3)  # SES enforces it from now on
    ses.enforce_daily = True
    settings = quick_settings(redis_url, ses_account_refresh=300)
    gate_waits: list[float] = []
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        run.sender.gate.observer = gate_waits.append
        mails = [
            Mail(sender="app@example.com", to=[f"u{i}@example.org"], subject="s", text="t") for i in range(6)
        ]
        await client.send_many("acme", mails)
        await wait_for_async(
            lambda: any(wait > 60 for wait in gate_waits), within=20, what="the sender to hold for the day"
        )
        refused = [r for r in ses.rejections if r.error.code == "LimitExceededException"]
        account_reads = ses.account_requests
    assert ses.sent_count == 3
    # One refusal per mail SES had in hand when the day ran out, then nothing: no loop.
    assert len(refused) <= 3, len(refused)
    assert account_reads >= 1
