"""A fault of one tenant's own SES set-up holds that tenant alone.

Its sender identity unverified or denied (IAM, a ``ses:FromAddress``
condition), its configuration set missing, its SES tenant paused: SES
refuses that tenant's mail and nobody else's. The sender must park that
tenant alone (reason ``ses_<code>``, rechecked with a growing backoff),
count no attempt, dead-letter nothing, and delay no other tenant; only an
account-level refusal holds the whole sender.
"""

from __future__ import annotations

import pytest

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.sdk.keys import mail_keys
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import Faults, SesError, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings

GOOD = ("g1", "g2", "g3", "g4")

TENANT_FAULTS = [
    Faults.ACCESS_DENIED_IDENTITY,
    Faults.ACCESS_DENIED_FROM_ADDRESS,
    Faults.ACCESS_DENIED,
    Faults.IDENTITY_NOT_VERIFIED,
    Faults.MAIL_FROM_DOMAIN_NOT_VERIFIED,
    Faults.CONFIGURATION_SET_MISSING,
    Faults.TENANT_SENDING_PAUSED,
]


def mail(i: int) -> Mail:
    return Mail(sender="app@example.com", to=[f"user{i}@example.org"], subject=f"m{i}", text="hi")


async def all_in(client: AsyncMailClient, ids: list[str], state: str) -> bool:
    states = [(await client.status(i)).state for i in ids]
    return all(s == state for s in states)


@pytest.mark.parametrize("fault", TENANT_FAULTS, ids=lambda f: f"{f.code}:{f.message[:24]}")
async def test_one_tenants_ses_fault_held_every_tenant_or_dead_lettered_its_mail(
    redis_url: str, ses_env: SesServer, fault: SesError
) -> None:
    ses = ses_env
    settings = quick_settings(
        redis_url,
        tenants={"bad": {"ses_tenant_name": "bad-tenant", "configuration_set": "bad-events"}},
        inflight_cap=10,
    )
    rule = ses.fail_when(lambda m: m.tag("fairpost-tenant") == "bad", fault)
    gate_waits: list[float] = []
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        run.sender.gate.observer = gate_waits.append
        bad = await client.send_many("bad", [mail(i) for i in range(5)])
        good = {t: await client.send_many(t, [mail(i) for i in range(8)]) for t in GOOD}
        every_good = [i for ids in good.values() for i in ids]
        await wait_for_async(
            lambda: all_in(client, every_good, JobState.SENT), within=30, what="the good mail"
        )
        held = [await client.status(i) for i in bad]

        async def stats_show_the_hold() -> bool:
            stats = await collect_stats(run.store.redis, mail_keys(run.store.keys), settings, tenants=["bad"])
            shown = stats.tenant("bad")
            return shown is not None and shown.held_by == f"ses_{fault.code}"

        # Between two holds the tenant is rechecked; each hold is longer than the last.
        await wait_for_async(stats_show_the_hold, within=20, what="stats to show why the tenant waits")
        probes = sum(
            1 for r in ses.rejections if r.mail is not None and r.mail.tag("fairpost-tenant") == "bad"
        )
        # Fixed: the tenant's mail goes out at its next recheck.
        rule.cancel()
        await wait_for_async(
            lambda: all_in(client, bad, JobState.SENT), within=40, what="the held tenant's mail"
        )
        resumed = [await client.status(i) for i in bad]
        stats = run.sender.stats
    # Nobody else waited: the sender never held itself (its gate never closed), and
    # every other tenant's mail went out, each once.
    assert gate_waits and all(wait == 0 for wait in gate_waits), max(gate_waits)
    assert "paused" not in stats.by_reason
    for tenant, ids in good.items():
        assert sorted(m.job_id or "" for m in ses.sent if m.tag("fairpost-tenant") == tenant) == sorted(ids)
    # The faulty tenant waited, saying why; no attempt counted, nothing dead.
    assert all(s.state not in (JobState.DEAD, JobState.SENT) for s in held)
    assert all(s.attempts == 0 for s in held)
    assert all(s.waiting_for == f"ses_{fault.code}" for s in held if s.throttled or s.waiting_for)
    assert any(s.waiting_for == f"ses_{fault.code}" for s in held)
    # Rechecked one mail at a time, not a loop: the first batch, then one mail per recheck
    # (holds of 1, 2, 4, 8, 16 s: a handful of rechecks however slow the machine).
    assert probes <= len(bad) + 8, probes
    assert all(s.attempts == 0 and s.dead_reason is None for s in resumed)
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(every_good + bad)


async def test_an_account_wide_refusal_holds_the_whole_sender(redis_url: str, ses_env: SesServer) -> None:
    """The other half: an AccessDenied that names nothing, while GetAccount says the
    account cannot send, is the account's. The whole sender holds, keeping every job."""
    ses = ses_env
    settings = quick_settings(redis_url, sender={"wait_seconds": 1, "receivers": 1, "pause_seconds": 5})
    ses.pause(Faults.ACCESS_DENIED)  # every send refused; GetAccount: SendingEnabled false
    gate_waits: list[float] = []
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        run.sender.gate.observer = gate_waits.append
        ids = {t: await client.send_many(t, [mail(i) for i in range(2)]) for t in GOOD}
        await wait_for_async(lambda: any(w > 2 for w in gate_waits), within=20, what="the sender to hold")
        ses.resume()
        every = [i for tenant_ids in ids.values() for i in tenant_ids]
        await wait_for_async(lambda: all_in(client, every, JobState.SENT), within=40, what="every mail")
        statuses = [await client.status(i) for i in every]
        stats = run.sender.stats
    assert stats.by_reason.get("paused", 0) >= 1
    assert "tenant" not in stats.by_reason
    assert all(s.attempts == 0 and s.dead_reason is None for s in statuses)
