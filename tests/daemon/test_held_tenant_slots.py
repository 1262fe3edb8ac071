"""A tenant held for its own SES fault keeps its in-flight slots and its jobs alive.

While SES refuses a tenant's set-up (identity not verified, access denied, a
configuration set missing: ``ses_<code>``), the tenant's mail waits in SQS,
one message rechecked after each hold. Its slots and its dispatched jobs'
deadlines must last as long as the hold, or the slots lapse (and more of its
backlog goes to SQS) and the reconciler takes its jobs for lost while SQS still
holds them. Short TTLs through settings, real redis-server; the pipeline test
runs with moto's SQS and the recording SES server.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.replies import time_ms
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.quota.holds import TenantHolds
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.daemon.test_reconcile import reconciling, stopped
from tests.support import KEYS
from tests.support.pipeline import pipeline, quick_settings

TTL_MS = 2_000
LIMITS = StoreLimits(default_cap=2, lease_ms=1_000, inflight_ttl_ms=TTL_MS, stranded_after_ms=TTL_MS + 7_000)


async def hand_off(store: JobStore, ids: list[str]) -> None:
    await store.enqueue([NewJob(id=i, tenant="acme", kind="mail", payload="{}") for i in ids])
    claimed = [job.id for job in await store.claim(10)]
    assert claimed == ids
    await store.handed_off(claimed)


async def kept_until(client: redis.asyncio.Redis, ids: list[str]) -> tuple[list[float], list[float]]:
    """Each job's slot expiry and its stranded deadline (ms)."""
    slots = [await client.zscore(KEYS.inflight("acme"), i) for i in ids]
    deadlines = [await client.zscore(KEYS.dispatched(), i) for i in ids]
    assert None not in slots and None not in deadlines
    return [float(s or 0) for s in slots], [float(d or 0) for d in deadlines]


@pytest.mark.parametrize(
    "reason", ["ses_MessageRejected", "ses_AccessDeniedException", "ses_NotFoundException"]
)
async def test_a_hold_keeps_the_tenants_slots_and_deadlines_until_it_ends(
    aredis: redis.asyncio.Redis, reason: str
) -> None:
    store = JobStore(aredis, KEYS, LIMITS)
    holds = TenantHolds(aredis, KEYS, LIMITS)
    await hand_off(store, ["acme-0"])
    hold, _ = await holds.hold("acme", reason, first_seconds=60, most_seconds=600)
    slots, deadlines = await kept_until(aredis, ["acme-0"])
    # Rechecked at the hold's end: its mail may wait in SQS a TTL past that, like a park's.
    assert slots == [hold.until_ms + TTL_MS]
    assert deadlines == [hold.until_ms + LIMITS.stranded_after_ms]

    # A hold still in force, met again (another of its mails refused): a slot taken
    # since is kept as long too, and none is shortened.
    await hand_off(store, ["acme-1"])
    again, _ = await holds.hold("acme", reason, first_seconds=60, most_seconds=600)
    assert again == hold
    slots, deadlines = await kept_until(aredis, ["acme-0", "acme-1"])
    assert slots == [hold.until_ms + TTL_MS] * 2
    assert deadlines == [hold.until_ms + LIMITS.stranded_after_ms] * 2


def mails(count: int) -> list[Mail]:
    return [
        Mail(sender="app@bad.example", to=[f"user{i}@example.org"], subject=f"m{i}", text="hi")
        for i in range(count)
    ]


async def test_a_tenant_held_past_its_stranded_deadline_is_neither_reconciled_nor_overflowed(
    redis_url: str, ses_env: SesServer
) -> None:
    ses = ses_env
    # Stranded after 3 (in-flight TTL) + 5 (visibility) + 2 (longest back-off) = 10 s
    # without progress; the tenant's holds (1 s, then 2 s each) go on longer than that.
    settings = quick_settings(
        redis_url,
        tenants={"bad": {"configuration_set": "bad-events"}},
        inflight_cap=2,
        reconcile_handoffs=1,
        # A claim's slot lasts its lease, then the hand-off's TTL: both short.
        dispatcher={"inflight_ttl_seconds": 3, "lease_seconds": 2},
        sender={
            "wait_seconds": 1,
            "receivers": 1,
            "visibility_timeout": 5,
            "backoff_base_seconds": 1,
            "backoff_max_seconds": 2,
            "pause_seconds": 1,
            "max_jitter_seconds": 0.2,
        },
    )
    stranded_ms = int(settings.stranded_after_seconds() * 1000)
    rule = ses.fail_when(lambda m: m.tag("fairpost-tenant") == "bad", Faults.CONFIGURATION_SET_MISSING)
    metrics = Metrics()
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        ids = await client.send_many("bad", mails(4))
        first, rest = ids[:2], ids[2:]

        async def states() -> list[str]:
            return [(await client.status(i)).state for i in ids]

        async def cap_in_sqs() -> bool:
            return await states() == [JobState.DISPATCHED] * 2 + [JobState.QUEUED] * 2

        await wait_for_async(cap_in_sqs, within=10, what="a cap's worth handed to SQS")
        task = await reconciling(run, metrics)
        try:
            handed_ms = max([int((await run.store.job(i))["dispatched_ms"]) for i in first])

            async def held_past_stranded() -> bool:
                now = time_ms(await run.store.redis.time())
                return now > handed_ms + stranded_ms + 2_000

            # The hold outlasts the deadline by two seconds of Redis time (the reconciler
            # looks every 0.2 s), rechecked and refused all along.
            await wait_for_async(held_past_stranded, within=30, what="the hold to outlast the deadline")
            during = await states()
            records: list[dict[str, Any]] = [await run.store.job(i) for i in ids]
            probes = sum(1 for r in ses.rejections if r.mail and r.mail.tag("fairpost-tenant") == "bad")
            rule.cancel()
            await wait_for_async(
                lambda: all_sent(client, ids), within=30, what="the tenant's mail once its set-up is fixed"
            )
        finally:
            await stopped(task)
    assert probes >= 4, f"the tenant was rechecked only {probes} times: no hold outlasted the deadline"
    # Its slots lasted: the rest of its backlog stayed in Redis; nothing was taken for lost.
    assert during == [JobState.DISPATCHED] * 2 + [JobState.QUEUED] * 2, during
    assert not any("reconciled" in r for r in records), records
    assert metrics.reconciled_total.labels("handed_again")._value.get() == 0
    assert metrics.reconciled_total.labels("dead")._value.get() == 0
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(first + rest), "each job sent exactly once"


async def all_sent(client: AsyncMailClient, ids: list[str]) -> bool:
    return {(await client.status(i)).state for i in ids} == {JobState.SENT}
