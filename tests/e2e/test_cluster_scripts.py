"""Every Lua script fairpost runs, run on a real 6-node Redis Cluster, through the
client the product builds for it (dispatcher/connect.py).

Each call must declare at least one key, and every declared key must hash to
fairpost's one slot (the ``{prefix}`` hash tag). Every script is loaded here with a
``#!lua`` shebang first (scripts/enqueue.lua has it already): with it Redis 7 itself
refuses, in cluster mode, a script that touches any key outside the slot of its
declared keys ("Script attempted to access keys that do not hash to the same
slot"), declared or built inside the script from a prefix. So a pass means that
every key each script can reach on these paths lives in the declared keys' slot.
The test fails if a ``.lua`` file is never run (a helper prepended to others runs
inside each of them).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from importlib.resources import files
from typing import Any

import pytest
import redis
import redis.asyncio
from prometheus_client import CollectorRegistry
from redis.commands.core import AsyncScript, Script
from redis.crc import key_slot
from redis.lock import Lock

from fairpost.config import Settings
from fairpost.config.limits import parse_limits
from fairpost.dispatcher.calls import RING_GOES_HERE, outcome_journal, store_limits
from fairpost.dispatcher.connect import async_redis_client, redis_client, slot_of
from fairpost.dispatcher.jobs import JobState, NewJob
from fairpost.dispatcher.journal import JournalWriter
from fairpost.dispatcher.layout import LAYOUT, read_layout
from fairpost.dispatcher.lifecycle import Lifecycle, SyncLifecycle
from fairpost.dispatcher.migrate import Migration
from fairpost.dispatcher.scripts import lua_source
from fairpost.dispatcher.store import JobStore
from fairpost.dispatcher.stranded import StrandedJobs
from fairpost.mailer.daemon.events import OUTCOME_RANK
from fairpost.mailer.daemon.feedback import Feedback
from fairpost.mailer.daemon.health import Heartbeat, Liveness
from fairpost.mailer.daemon.mail_jobs import MailJobs
from fairpost.mailer.daemon.webhooks.loop import WebhookDeliveries
from fairpost.mailer.daemon.webhooks.metrics import WebhookMetrics
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.holds import TenantHolds
from fairpost.mailer.quota.overrides import OverrideCache
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.quota.warmup_admin import WarmupAdmin
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import deliveries, feed
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.sdk.rollups import RollupWriter
from fairpost.mailer.sdk.unsubscribes import Unsubscribes, unsubscribe
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.conftest import delivering
from tests.outcomes.receiver import Receiver
from tests.support.pipeline import quick_settings
from tests.support.topologies import Cluster

pytestmark = pytest.mark.cluster

PACKAGES = (
    "fairpost.dispatcher",
    "fairpost.mailer.daemon",
    "fairpost.mailer.quota",
    "fairpost.mailer.sdk",
    "fairpost.mailer.sdk.outcomes",
)
LOCK_SCRIPTS = {Lock.LUA_RELEASE_SCRIPT, Lock.LUA_EXTEND_SCRIPT, Lock.LUA_REACQUIRE_SCRIPT}
"""redis-py's Lock (dispatcher/migrate.py): not fairpost's scripts, registered unwrapped (the
Lock keeps each on its class, where a wrapping function would become a method); its one
key, :meth:`MailKeys.migrate_lock`, carries the hash tag as every key."""
HELPERS = {
    "dispatcher/ring",
    "dispatcher/journal",
    "dispatcher/history",
    "outcomes/deliveries",
    "quota/windows",
}
"""Not scripts of their own: the shared helpers other scripts start with."""


def every_script() -> dict[str, str]:
    """name -> text of every .lua file the product ships, named ``<package>/<file>``
    (two packages ship a claim.lua, a reap.lua and a replay.lua)."""
    out = {}
    for package in PACKAGES:
        for entry in files(package).iterdir():
            file = entry.name.removesuffix(".lua")
            name = f"{package.rpartition('.')[2]}/{file}"
            if entry.name.endswith(".lua") and name not in HELPERS:
                out[name] = lua_source(package, file)
    return out


class Recorder:
    """Wraps ``register_script`` of both redis-py faces: checks each call's keys and
    records which script ran."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.scripts = every_script()
        self.ran: set[str] = set()

    def name(self, source: str) -> str:
        # The longest file the source ends with: "ring + enqueue" is enqueue (a
        # script with a check before ring.lua ends with what follows the check).
        found = [
            n
            for n, text in self.scripts.items()
            if source.rstrip().endswith(text.partition(RING_GOES_HERE)[2].rstrip() or text.rstrip())
        ]
        assert found, f"a script fairpost does not ship:\n{source[:200]}"
        return max(found, key=lambda n: len(self.scripts[n]))

    def check(self, name: str, keys: list[Any] | None) -> None:
        assert keys, f"{name}.lua was called without declaring a key"
        slots = {key_slot(k if isinstance(k, bytes) else str(k).encode()) for k in keys}
        assert slots == {self.slot}, f"{name}.lua declares keys outside fairpost's slot: {keys}"
        self.ran.add(name)

    def wrap_sync(self, register: Callable[..., Script]) -> Callable[..., Any]:
        recorder = self

        def register_script(client: Any, source: str) -> Any:
            if source in LOCK_SCRIPTS:
                return register(client, source)
            name = recorder.name(source)
            real = register(client, source if source.startswith("#!") else "#!lua\n" + source)

            def call(keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None) -> Any:
                recorder.check(name, keys)
                return real(keys=keys, args=args, client=client)

            return call

        return register_script

    def wrap_async(self, register: Callable[..., AsyncScript]) -> Callable[..., Any]:
        recorder = self

        def register_script(client: Any, source: str) -> Any:
            name = recorder.name(source)
            real = register(client, source if source.startswith("#!") else "#!lua\n" + source)

            async def call(
                keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
            ) -> Any:
                recorder.check(name, keys)
                return await real(keys=keys, args=args, client=client)

            return call

        return register_script


@pytest.fixture
def cluster_settings(cluster_srv: Cluster) -> Settings:
    cluster_srv.flush()
    return quick_settings(
        redis_url=cluster_srv.url,
        redis_cluster=True,
        inflight_cap=5,
        events_queue_name="fairpost-events",
        warmup={"plan": "5/second from 0s | none from 1 day"},
        webhook={"allow_private": True, "timeout_seconds": 3},  # to a receiver on 127.0.0.1
    )


@pytest.fixture
def recorder(cluster_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    recorder = Recorder(slot_of(cluster_settings))
    monkeypatch.setattr(redis.Redis, "register_script", recorder.wrap_sync(redis.Redis.register_script))
    monkeypatch.setattr(
        redis.asyncio.Redis, "register_script", recorder.wrap_async(redis.asyncio.Redis.register_script)
    )
    yield recorder


async def _promoted_one(lifecycle: Lifecycle) -> bool:
    moved, _ = await lifecycle.promote_due()
    return moved == 1


async def _later_than(store: JobStore, ms: int) -> bool:
    return await store.now_ms() > ms


async def _warmup_over(cache: OverrideCache, tenant: str) -> bool:
    await cache.refresh()
    return tenant not in cache.warmups.fingerprints()


def job(tenant: str, **kwargs: Any) -> NewJob:
    return NewJob(id=uuid.uuid4().hex, tenant=tenant, kind="mail", payload="{}", **kwargs)


async def test_every_script_runs_on_a_cluster_within_fairposts_slot(
    cluster_settings: Settings, recorder: Recorder
) -> None:
    settings = cluster_settings
    keys = MailKeys(settings.key_prefix)
    limits = store_limits(settings)
    client = async_redis_client(settings)
    try:
        store = JobStore(client, keys, limits)
        lifecycle = Lifecycle(client, keys, limits)
        now = await store.now_ms()

        # the key layout: read (and stamped) by a daemon's start
        assert await read_layout(client, keys) == LAYOUT

        # enqueue, claim, renew, requeue, handoff, defer, finish, reap, touch, keep
        a, b, c = job("acme"), job("acme"), job("beta", send_at_ms=now + 200)
        await store.enqueue([a, b])
        await store.enqueue([c])
        await wait_for_async(
            lambda: _promoted_one(lifecycle), within=10, what="the scheduled job due and promoted"
        )
        claimed = await store.claim(3)
        assert {j.id for j in claimed} == {a.id, b.id, c.id}
        # A renewal pushes a lease later (ZADD GT): within the claim's own
        # millisecond it would push it nowhere, and count nothing.
        claimed_by = await store.now_ms()
        await wait_for_async(
            lambda: _later_than(store, claimed_by), within=10, what="Redis's clock past the claim"
        )
        assert await store.renew([a.id]) == 1
        assert await store.requeue([b.id]) == 1
        await store.handed_off([a.id, c.id])
        # defer: a dispatched job taken back (the per-provider guard), with its outcome event
        held = feed.entry(feed.HELD, {"reason": "provider_paused:gmail"})
        assert await store.defer([c.id], 60_000, "provider_paused:gmail", entries={c.id: held}) == [1]
        await store.touch_inflight("acme", now + 60_000)
        await store.keep_inflight(60_000, now + 60_000, 0, 100)
        assert await MailJobs(store).claim_sending([a.id], 60_000) == [1]
        # kept past its record's detail TTL: its line goes in a day's history bucket,
        # whose name finish.lua builds (history.lua); read back, and given SES's verdict
        assert await store.finish(a.id, JobState.SENT, keep_seconds=settings.job_detail_ttl + 60) == 1
        assert (await store.history.record(a.id))["state"] == "sent"
        assert await store.history.outcome(a.id, ("delivery", "delivered"), OUTCOME_RANK) == 1
        await store.reap()
        await store.sync_tenant_settings({"acme": 2}, {"acme": 5})
        assert await store.count_attempt(a.id, "a transient error") == 1
        liveness, running = Liveness(), asyncio.create_task(asyncio.sleep(3600))
        liveness.watch({"dispatcher": running})
        assert await Heartbeat(client, keys, "r1", liveness).beat()
        running.cancel()

        # cancel, dead letters, replay, purge, the reconciler's scan
        assert await lifecycle.cancel(b.id, 60) == "queued"
        await MailJobs(store).record_dead(
            uuid.uuid4().hex, "beta", "an unreadable message", "raw", keep_seconds=60
        )
        with redis_client(settings) as sync_client:
            sync_lifecycle = SyncLifecycle(sync_client, keys, limits)
            sync_lifecycle.replay(b.id)
            assert sync_lifecycle.cancel(b.id, 60) == "queued"
            assert sync_lifecycle.purge([b.id]) == 1
            # fairpost migrate: a pre-release record's payload field moved to its key
            sync_client.delete(keys.layout())
            sync_client.hset(keys.job("legacy"), mapping={"state": "dead", "payload": "{}"})
            assert Migration(sync_client, keys, say=lambda _: None).run() == 1
        await StrandedJobs(client, keys, limits).scan(handoffs_allowed=10)

        # a bulk job (notification mail): claimed from its tenant's bulk lane
        bulk = job("bulky", priority="bulk.normal")
        await store.enqueue([bulk])
        assert [j.id for j in await store.claim(1)] == [bulk.id]

        # unsubscribes: an operator's (counted in the rollups), taken back; a recipient's click
        with Unsubscribes(settings) as unsubscribes:
            assert unsubscribes.add("acme", "ada@example.org", "digest")
            assert unsubscribes.remove("acme", "ada@example.org", "digest")
        assert await unsubscribe(client, settings, "acme", "ada@example.org", "comments", "link")

        # live control: pause and resume a tenant
        with QuotaAdmin(settings) as admin:
            admin.pause("acme")
            admin.resume("acme")

        # quotas: every quota script; the reputation guard
        quota = QuotaEngine(client, keys)
        g, t = parse_limits("10/second; 100/minute"), parse_limits("5/second")
        grant = await quota.acquire("acme", [1, 2], g, t)
        await quota.acquire("acme", [1], g, t, weight=2)
        await quota.refund("acme", 1, grant.at_ms, g, t)
        await quota.restamp("acme", 1, grant.at_ms, g, t)
        await quota.usage("acme", t)
        await quota.usage(None, g)
        await quota.global_retry_after(g)
        await quota.retry_after("acme", t)
        book = ReputationBook(client, keys, settings)
        await book.record("acme", sends=3, bounces=1, bounced=(a.id, 1))
        await TenantHolds(client, keys, limits).hold("acme", "a reason", first_seconds=1, most_seconds=5)
        async with store.pipeline() as pipe:
            feedback = Feedback(store=store, settings=settings, book=book)
            await feedback.index_sent(pipe, "acme", [(a.id, "ses-message-id", 1)])
            await pipe.execute()

        # warm-up: an operator sets, restarts and skips plans; a replica's refresh
        # starts the default plan for a tenant it meets, and ends one whose last step came
        with WarmupAdmin(settings) as warmups:
            warmups.set_plan("warm", "10/second from 0s | none from 1s")
            warmups.restart("warm")
            warmups.use_default("acme")
            assert warmups.skip("acme")
        cache = OverrideCache(client, keys, settings)
        cache.limits_for("newco")
        await cache.refresh()
        assert "newco" in cache.warmups.fingerprints()
        await wait_for_async(lambda: _warmup_over(cache, "warm"), within=10, what="warm's last step taken")

        with Receiver().running() as receiver, Webhooks(settings) as hooks:
            # the outcome feed: an SES event appended as the events consumer does
            made = hooks.add("acme", receiver.url("/acme"))
            receiver.secret("/acme", made.secret)
            since = hooks.get(made.id).created
            journal = JournalWriter(client, outcome_journal(settings))
            given = feed.entry(feed.DELIVERED, {"ses_message_id": "ses-message-id"})
            async with client.pipeline(transaction=True) as pipe:
                await journal.append(keys.job(a.id), a.id, given, pipeline=pipe)
                await pipe.execute()

            # webhooks: fanned out, claimed by a replica that dies, reaped, delivered,
            # settled; then replayed
            dying = WebhookDeliveries(client, keys, settings, WebhookMetrics(CollectorRegistry()))
            assert await dying.fanout_once() == 1
            claim = client.register_script(deliveries.script("claim"))
            claim_keys, claim_args = deliveries.DeliveryCalls(keys).claim(10, 4, 200, 16)  # a 200 ms lease
            [taken] = deliveries.claimed(await claim(keys=claim_keys, args=claim_args))
            async with delivering(settings) as [replica]:
                await wait_for_async(lambda: replica.delivered == 1, within=10, what="the reaped delivery")
            [delivery] = receiver.verified("/acme")
            assert delivery.event_id == taken.event_id
            assert delivery.event is not None and delivery.event["data"]["job_id"] == a.id
            assert hooks.replay(made.id, since) == 1

            # deliverability: a group's counts, queued on a pipeline as the sender does
            pipe = client.pipeline(transaction=False)
            await RollupWriter(client, keys, settings).queue(pipe, "acme", {("gmail", "sent"): 1}, sent_now=1)
            await pipe.execute()
    finally:
        await client.aclose()

    assert recorder.ran == set(recorder.scripts), f"never run: {sorted(set(recorder.scripts) - recorder.ran)}"
