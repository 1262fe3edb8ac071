"""Every hold on a tenant, asked and told through one module (mailer/daemon/holds.py).

Fast: a real redis-server (the fixture's), no SQS and no SES. The pauses come
from a fake of the live overrides and SES's verdict on SES tenants from a fake
of the status task: both are read from memory by the sender, so a set is all
they are. One test runs the pipeline, for what only SQS can show: a resume
brings the held tenant's mail back at once.
"""

from __future__ import annotations

import json

import pytest
import redis
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.config import Settings, load_settings
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.replies import time_ms
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.cli import main
from fairpost.mailer.daemon.holds import (
    FORGET_AFTER_SECONDS,
    KEEP_ALIVE_SLACK_MS,
    PAUSED_RECHECK_SECONDS,
    Hold,
    Holds,
    forget_ended,
)
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.holds import LIFTED_BY_RESUME, SES_TENANT_DISABLED
from fairpost.mailer.quota.provider_guard import ProviderHold
from fairpost.mailer.quota.reputation import GuardState
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import KEYS
from tests.support.pipeline import pipeline, quick_settings

TTL_MS = 2_000
LIMITS = StoreLimits(default_cap=2, lease_ms=1_000, inflight_ttl_ms=TTL_MS, stranded_after_ms=TTL_MS + 7_000)


class Pauses:
    """The live overrides' pauses (OverrideCache reads them from Redis every 2 s)."""

    def __init__(self) -> None:
        self.paused: set[str] = set()

    def is_paused(self, tenant: str) -> bool:
        return tenant in self.paused


class SesTenants:
    """SES's verdict on SES tenants (SesTenantStatus, which reads SES on its own task)."""

    def __init__(self) -> None:
        self.disabled: set[str] = set()
        self.waited: list[str] = []

    def waiting(self, tenant: str) -> None:
        self.waited.append(tenant)

    def is_disabled(self, tenant: str) -> bool:
        return tenant in self.disabled


@pytest.fixture
def quick(redis_url: str) -> Settings:
    return load_settings(redis_url=redis_url, sender={"backoff_base_seconds": 60, "backoff_max_seconds": 600})


def made(aredis: redis.asyncio.Redis, settings: Settings) -> tuple[Holds, Pauses, SesTenants]:
    pauses, ses = Pauses(), SesTenants()
    return Holds(JobStore(aredis, KEYS, LIMITS), settings, pauses.is_paused, ses_tenants=ses), pauses, ses


async def test_the_one_question_names_each_hold_with_its_recheck(
    aredis: redis.asyncio.Redis, quick: Settings
) -> None:
    holds, pauses, ses = made(aredis, quick)
    assert holds.of("acme") is None
    assert ses.waited == ["acme"], "asking tells the status task the tenant has mail waiting"

    pauses.paused.add("acme")
    assert holds.of("acme") == Hold("paused", PAUSED_RECHECK_SECONDS)

    # The same pause, made by the reputation guard: the guard's hash says so.
    await aredis.hset(KEYS.guard(), "acme", json.dumps(_guard("paused").to_json()))
    await holds.refresh()
    assert holds.of("acme") == Hold("reputation_paused", PAUSED_RECHECK_SECONDS)
    pauses.paused.clear()
    assert holds.of("acme") is None, "a guard state without the pause holds nothing"

    ses.disabled.add("acme")
    assert holds.of("acme") == Hold(SES_TENANT_DISABLED, PAUSED_RECHECK_SECONDS)
    ses.disabled.clear()

    reason, until_ms, wait = await holds.hold_for_ses("acme", "ses_MessageRejected")
    assert (reason, wait) == ("ses_MessageRejected", 60.0)
    assert until_ms == int((await aredis.hget(KEYS.tenant_hold("acme"), "until_ms")) or 0)
    hold = holds.of("acme")
    assert hold is not None and hold.reason == "ses_MessageRejected"
    assert 59.0 < hold.recheck <= 60.0 and hold.until is not None
    assert holds.of("globex") is None, "a hold is its tenant's alone"


async def test_an_ses_fault_hold_ends_in_a_probe_and_a_send_clears_it_everywhere(
    aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    settings = load_settings(
        redis_url=redis_url, sender={"backoff_base_seconds": 0.05, "backoff_max_seconds": 600}
    )
    holds, _, _ = made(aredis, settings)
    await holds.hold_for_ses("acme", "ses_AccessDeniedException")
    assert holds.probing("acme")

    async def ended() -> bool:
        return holds.of("acme") is None

    await wait_for_async(ended, within=5, what="the 50 ms hold to end")
    assert holds.probing("acme"), "its next mail asks SES alone"
    await holds.sent("acme")
    assert not holds.probing("acme")
    assert not await aredis.exists(KEYS.tenant_hold("acme")), "every replica sees it cleared"


def test_tenants_whose_holds_ended_long_ago_are_forgotten_and_the_rest_kept() -> None:
    """Pure: the map of SES-fault holds, swept by the function Holds calls on each hold
    (moved from tests/daemon/test_answers_bounds.py with the map)."""
    now = 100_000.0
    held = {f"gone-{n}": ("ses_AccessDenied", now - FORGET_AFTER_SECONDS - 1) for n in range(1_000)}
    held["rechecking"] = ("ses_AccessDenied", now - 10)  # ended a moment ago: its next mail probes
    held["held"] = ("ses_AccessDenied", now + 30)
    next_sweep = forget_ended(held, now)
    assert set(held) == {"rechecking", "held"}
    assert next_sweep == 64  # never below the first bound: sweeps stay rare


async def test_a_hold_lifted_elsewhere_wakes_the_sender_through_the_one_event(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis, quick: Settings
) -> None:
    holds, _, _ = made(aredis, quick)
    woken: list[str | None] = []

    async def wake(tenant: str | None) -> None:
        woken.append(tenant)

    holds.listen(wake)
    await holds.hold_for_ses("acme", "ses_MessageRejected")
    await holds.refresh()
    assert woken == [], "a hold still in Redis is not lifted"

    with QuotaAdmin(quick, redis_client=redis_client) as admin:
        assert admin.lift_holds("acme") == ["ses_MessageRejected"]
    await holds.refresh()
    assert woken == ["acme"]
    assert holds.of("acme") is None and holds.probing("acme"), "lifted: its next mail rechecks SES"
    await holds.refresh()
    assert woken == ["acme"], "told once"

    await holds.changed(None)
    assert woken == ["acme", None], "a change of the global limits is the same event"


async def test_a_wake_that_failed_is_told_again_on_the_next_refresh(
    aredis: redis.asyncio.Redis, quick: Settings
) -> None:
    holds, _, _ = made(aredis, quick)
    calls: list[str | None] = []

    async def failing_once(tenant: str | None) -> None:
        calls.append(tenant)
        if len(calls) == 1:
            raise ConnectionError("SQS unreachable")

    holds.listen(failing_once)
    await holds.hold_for_ses("acme", "ses_MessageRejected")
    await aredis.delete(KEYS.tenant_hold("acme"))
    with pytest.raises(ConnectionError):
        await holds.refresh()
    assert holds.of("acme") is not None, "not lifted here until the sender was told"
    await holds.refresh()
    assert calls == ["acme", "acme"] and holds.of("acme") is None


@pytest.mark.parametrize("reason", ["paused", "ses_MessageRejected", SES_TENANT_DISABLED, "tenant_quota"])
async def test_every_hold_and_park_keeps_the_tenants_slots_and_jobs_alive_one_way(
    aredis: redis.asyncio.Redis, quick: Settings, reason: str
) -> None:
    store = JobStore(aredis, KEYS, LIMITS)
    holds, _, _ = made(aredis, quick)
    await store.enqueue([NewJob(id="acme-0", tenant="acme", kind="mail", payload="{}")])
    await store.handed_off([job.id for job in await store.claim(10)])
    if reason == "ses_MessageRejected":
        _, until_ms, _ = await holds.hold_for_ses("acme", reason)
    else:
        # How the group decision parks a held (or over-quota) tenant's mail: for an hour.
        until_ms = time_ms(await aredis.time()) + 3_600_000
        await holds.keep_alive("acme", until_ms)
    assert await aredis.zscore(KEYS.inflight("acme"), "acme-0") == until_ms + TTL_MS
    assert await aredis.zscore(KEYS.dispatched(), "acme-0") == until_ms + LIMITS.stranded_after_ms


async def test_a_throttled_tenants_parks_touch_its_jobs_once_a_while_not_at_each(
    aredis: redis.asyncio.Redis, quick: Settings
) -> None:
    # A tenant over its quota is parked every few hundred ms, each park a little
    # later than the last: its slots live an in-flight TTL (30 min) past the park,
    # so touching every job of it at each park bought milliseconds of a half hour.
    store = JobStore(aredis, KEYS, LIMITS)
    holds, _, _ = made(aredis, quick)
    await store.enqueue([NewJob(id=f"acme-{i}", tenant="acme", kind="mail", payload="{}") for i in range(3)])
    await store.handed_off([job.id for job in await store.claim(10)])
    # Past the lease: the claim gave the slots the lease's end plus the TTL.
    now_ms = time_ms(await aredis.time()) + LIMITS.lease_ms
    await holds.keep_alive("acme", now_ms + 100)
    kept = await aredis.zscore(KEYS.inflight("acme"), "acme-0")
    assert kept == now_ms + 100 + TTL_MS
    # Here the TTL is 2 s: the slack is half of it.
    slack = min(KEEP_ALIVE_SLACK_MS, TTL_MS // 2)
    for step in range(1, 21):
        await holds.keep_alive("acme", now_ms + 100 + slack * step // 20)
    # Within the slack, the first touch stands.
    assert await aredis.zscore(KEYS.inflight("acme"), "acme-0") == kept
    # A park that ends later than the slack allows touches them again.
    later = now_ms + 100 + slack + 1
    await holds.keep_alive("acme", later)
    assert await aredis.zscore(KEYS.inflight("acme"), "acme-0") == later + TTL_MS


def test_resume_lifts_every_hold_an_operator_may_lift_and_says_which(
    redis_client: redis.Redis, quick: Settings
) -> None:
    redis_client.hset(KEYS.guard(), "acme", json.dumps(_guard("throttled").to_json()))
    redis_client.hset(KEYS.ses_tenant_status(), "acme", "{}")
    redis_client.hset(KEYS.tenant_hold("acme"), mapping={"reason": "ses_MessageRejected", "until_ms": 1})
    gmail = ProviderHold("gmail", "bounce rate 5% at gmail", 0.05, 0.0, 100, 1)
    redis_client.hset(KEYS.provider_guard(), "acme", json.dumps({"gmail": gmail.to_json()}))
    with QuotaAdmin(quick, redis_client=redis_client) as admin:
        admin.pause("acme")
        lifted = admin.lift_holds("acme")
        assert lifted == [
            "paused", "reputation_throttled", "provider_paused:gmail", "ses_MessageRejected",
            SES_TENANT_DISABLED,
        ]  # fmt: skip
        assert admin.resume("acme") is False, "nothing holds it any more"
        admin.pause("globex")
        redis_client.hset(KEYS.guard(), "globex", json.dumps(_guard("paused").to_json()))
        assert admin.lift_holds("globex") == ["reputation_paused"], "the guard's pause, named as such"
    assert not redis_client.exists(KEYS.tenant_hold("acme"))
    assert not redis_client.hexists(KEYS.ses_tenant_status(), "acme")
    assert not redis_client.hexists(KEYS.provider_guard(), "acme")
    named = {"ses_<code>" if r == "ses_MessageRejected" else r for r in lifted}
    named = {"provider_paused:<provider>" if r.startswith("provider_paused:") else r for r in named}
    assert named | {"reputation_paused"} == set(LIFTED_BY_RESUME), "--help names every hold resume lifts"


def _guard(level: str) -> GuardState:
    return GuardState(
        level=level,  # type: ignore[arg-type]
        reason="bounce rate 5% over 24h",
        bounce_rate=0.05,
        complaint_rate=0.0,
        window="24h",
        at_ms=0,
    )


async def test_resume_sends_an_ses_held_tenants_mail_at_once_not_after_its_backoff(
    redis_url: str, ses_env: SesServer
) -> None:
    """The pipeline (moto's SQS, the recording SES server): the tenant's set-up fixed,
    an operator's resume brings its mail, the message SES refused included, back at
    once: a hold of a minute would otherwise keep its FIFO group waiting."""
    ses = ses_env
    settings = quick_settings(
        redis_url,
        tenants={"bad": {"configuration_set": "bad-events"}},
        sender={"wait_seconds": 1, "receivers": 1, "backoff_base_seconds": 60, "max_jitter_seconds": 0.2},
    )
    rule = ses.fail_when(lambda m: m.tag("fairpost-tenant") == "bad", Faults.CONFIGURATION_SET_MISSING)
    async with pipeline(settings, reputation=True), AsyncMailClient(settings) as client:
        mail = Mail(sender="app@example.com", to=["u@example.org"], subject="m", text="hi")
        ids = await client.send_many("bad", [mail] * 3)

        async def held() -> bool:
            return (await client.status(ids[0])).waiting_for == "ses_NotFoundException"

        await wait_for_async(held, within=20, what="the tenant held for its configuration set")
        rule.cancel()
        with QuotaAdmin(settings) as admin:
            assert "ses_NotFoundException" in admin.lift_holds("bad")

        async def sent() -> bool:
            return {(await client.status(i)).state for i in ids} == {JobState.SENT}

        # Well within the hold's minute: the replica reads the lift within a refresh.
        await wait_for_async(sent, within=20, what="the tenant's mail once resumed")
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(ids), "each sent once"


def test_tenant_resume_help_lists_every_hold_it_lifts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tenant", "resume", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    missing = [reason for reason in LIFTED_BY_RESUME if reason not in shown]
    assert missing == [], shown
