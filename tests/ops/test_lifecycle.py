"""Job lifecycle against real Redis (and, end to end, moto's SQS and the recording SES):
idempotency keys, scheduled send, cancel, priorities, dead letters, retention.

No sleeps: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
import redis
import redis.asyncio

from fairpost import (
    AsyncMailClient,
    Attachment,
    DeadLetters,
    InvalidMail,
    Mail,
    MailClient,
    NotReplayable,
    TooLateToCancel,
    UnknownJob,
)
from fairpost.config import Settings, load_settings
from fairpost.dispatcher.jobs import Job, JobState
from fairpost.dispatcher.lifecycle import Lifecycle
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, store_limits
from fairpost.dispatcher.worker import HandedOff, Outcome
from fairpost.mailer.cli import main
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import KEYS, entry_ids
from tests.support.pipeline import pipeline, quick_settings

GOOD: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return load_settings(redis_url=redis_url, inflight_cap=10_000)


@pytest.fixture
def cli_env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)


def job_keys(r: redis.Redis) -> list[str]:
    return sorted(str(k) for k in r.scan_iter(match=KEYS.job("*")))


def queue(r: redis.Redis, tenant: str = "acme", priority: str = "normal") -> list[str]:
    """The ids waiting in the queue, in order (a cancelled job's id stays in the
    list until the claim drops it: it does not wait)."""
    ids = entry_ids(r.lrange(KEYS.queue(tenant, priority), 0, -1))
    return [job_id for job_id in ids if r.hget(KEYS.job(job_id), "state") == "queued"]


def in_an_hour() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


# -- idempotency keys ------------------------------------------------------------


def snapshot(r: redis.Redis) -> dict[bytes, Any]:
    return {key: r.dump(key) for key in r.scan_iter()}


def test_a_repeated_idempotency_key_returns_the_first_id_and_writes_nothing(
    client: MailClient, redis_client: redis.Redis, redis_url: str
) -> None:
    first = client.send("acme", **GOOD, idempotency_key="order-42")
    with redis.Redis.from_url(redis_url) as raw:
        before = snapshot(raw)
        again = client.send("acme", **{**GOOD, "subject": "other"}, idempotency_key="order-42")
        assert again == first
        assert snapshot(raw) == before
    assert queue(redis_client) == [first]
    # Another tenant's key is its own.
    other = client.send("globex", **GOOD, idempotency_key="order-42")
    assert other != first
    # The key lives FAIRPOST_IDEMPOTENCY_TTL (default 24 h), then a new job can be made.
    ttl = redis_client.ttl(KEYS.idempotency("acme", "order-42"))
    assert 86_390 <= ttl <= 86_400
    redis_client.delete(KEYS.idempotency("acme", "order-42"))  # as if it expired
    assert client.send("acme", **GOOD, idempotency_key="order-42") not in (first, other)


def test_idempotency_ttl_is_a_setting(redis_url: str, redis_client: redis.Redis) -> None:
    with MailClient(load_settings(redis_url=redis_url, idempotency_ttl=120)) as short:
        short.send("acme", **GOOD, idempotency_key="k")
    assert 110 <= redis_client.ttl(KEYS.idempotency("acme", "k")) <= 120


def test_send_many_takes_a_key_per_mail(client: MailClient, redis_client: redis.Redis) -> None:
    earlier = client.send("acme", **GOOD, idempotency_key="b")
    ids = client.send_many(
        "acme",
        [
            Mail(**GOOD, idempotency_key="a"),
            Mail(**GOOD, idempotency_key="b"),
            Mail(**GOOD),
            {**GOOD, "idempotency_key": "a"},
        ],
    )
    assert ids[1] == earlier
    assert ids[3] == ids[0]
    assert len({ids[0], ids[2], earlier}) == 3
    assert len(job_keys(redis_client)) == 3


def test_concurrent_senders_with_one_key_make_one_job(redis_url: str, redis_client: redis.Redis) -> None:
    settings = load_settings(redis_url=redis_url)
    start = threading.Barrier(16)
    ids: list[str] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            with MailClient(settings) as own:
                start.wait(timeout=10)
                ids.append(own.send("acme", **GOOD, idempotency_key="race"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert len(ids) == 16 and len(set(ids)) == 1
    assert job_keys(redis_client) == [KEYS.job(ids[0])]
    assert queue(redis_client) == [ids[0]]


async def test_concurrent_async_senders_with_one_key_make_one_job(
    aclient: AsyncMailClient, redis_client: redis.Redis
) -> None:
    ids = await asyncio.gather(*(aclient.send("acme", **GOOD, idempotency_key="race") for _ in range(32)))
    assert len(set(ids)) == 1
    assert queue(redis_client) == [ids[0]]


@pytest.mark.parametrize("key", ["", "x" * 257, "a\nb", 42])
def test_a_bad_idempotency_key_is_refused(client: MailClient, redis_client: redis.Redis, key: Any) -> None:
    with pytest.raises(InvalidMail) as caught:
        client.send("acme", **GOOD, idempotency_key=key)
    assert caught.value.field == "idempotency_key"
    assert redis_client.dbsize() == 0


# -- scheduled send ----------------------------------------------------------------


def test_a_naive_send_at_is_refused(client: MailClient, redis_client: redis.Redis) -> None:
    with pytest.raises(InvalidMail) as caught:
        client.send("acme", **GOOD, send_at=datetime.now() + timedelta(hours=1))
    assert caught.value.field == "send_at"
    assert "timezone-aware" in caught.value.rule
    with pytest.raises(InvalidMail) as many:
        client.send_many("acme", [Mail(**GOOD), Mail(**GOOD, send_at=datetime(2030, 1, 1))])
    assert many.value.field == "mails[1].send_at"
    assert redis_client.dbsize() == 0


def test_a_scheduled_job_waits_outside_its_queue(client: MailClient, redis_client: redis.Redis) -> None:
    when = in_an_hour()
    job_id = client.send("acme", **GOOD, send_at=when)
    status = client.status(job_id)
    assert status.state == "scheduled"
    assert status.scheduled_for is not None
    assert abs((status.scheduled_for - when).total_seconds()) < 0.002
    assert queue(redis_client) == []
    assert redis_client.zscore(KEYS.scheduled(), job_id) == int(when.timestamp() * 1000)
    # A time already past: queued at once.
    past = client.send("acme", **GOOD, send_at=datetime.now(UTC) - timedelta(minutes=1))
    assert client.status(past).state == "queued"
    assert queue(redis_client) == [past]


class Recorder:
    """A mail worker that hands everything off and notes what it got."""

    kind = "mail"
    max_batch = 10

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        self.jobs += jobs
        return [HandedOff() for _ in jobs]


REAP_INTERVAL = 20.0
"""The dispatchers' reap interval in the tests of due jobs: were a due time not waited
for, a job would wait out this interval; it is far longer than any load makes a
dispatcher late."""


def long_blocking_client(settings: Settings) -> redis.asyncio.Redis:
    """A client whose BLPOP may last a reap interval (redis-py's default socket timeout is 5 s)."""
    return redis.asyncio.Redis.from_url(settings.redis_url, socket_timeout=REAP_INTERVAL * 2)


async def test_due_jobs_enter_their_queues_once_across_replicas_when_due(
    settings: Settings, aclient: AsyncMailClient, redis_client: redis.Redis
) -> None:
    now = datetime.now(UTC)
    ids = []
    for tenant in range(5):
        mails = [Mail(**GOOD, send_at=now + timedelta(milliseconds=500 + i * 10)) for i in range(60)]
        ids += await aclient.send_many(f"t{tenant}", mails)
    assert redis_client.zcard(KEYS.scheduled()) == 300
    workers = [Recorder() for _ in range(3)]
    clients = [long_blocking_client(settings) for _ in workers]
    dispatchers = [
        Dispatcher(JobStore(c, KEYS, store_limits(settings)), [w], reap_interval=REAP_INTERVAL)
        for c, w in zip(clients, workers, strict=True)
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(d.run(stop)) for d in dispatchers]
    try:
        await wait_for_async(
            lambda: sum(len(w.jobs) for w in workers) >= 300, within=15, what="every scheduled job"
        )
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        # What run() left with the workers settles before the clients close (as the daemon does).
        await asyncio.wait_for(asyncio.gather(*(d.drain(5) for d in dispatchers)), 10)
        for c in clients:
            await c.aclose()
    claimed = collections.Counter(job.id for w in workers for job in w.jobs)
    assert sorted(claimed) == sorted(ids)
    assert set(claimed.values()) == {1}, "a scheduled job entered its queue twice"
    for job_id in ids:
        record = redis_client.hgetall(KEYS.job(job_id))
        late = int(record["queued_ms"]) - int(record["send_at_ms"])
        # Never early; and in (within the wait above) by waiting for its due time, not a reap.
        assert 0 <= late < REAP_INTERVAL * 1000, f"{job_id} entered its queue {late} ms after its send time"
        assert int(record["claimed_ms"]) >= int(record["send_at_ms"])
    assert redis_client.zcard(KEYS.scheduled()) == 0


async def test_an_idle_dispatcher_waits_exactly_for_the_next_due_job(
    settings: Settings, aclient: AsyncMailClient, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Recorder()
    store = JobStore(long_blocking_client(settings), KEYS, store_limits(settings))
    # A long reap interval: only the wait for the due time can bring the job in on time.
    dispatcher = Dispatcher(store, [worker], reap_interval=REAP_INTERVAL)
    waits: list[float] = []
    real_wait = store.wait_for_work

    async def wait_for_work(seconds: float) -> str | None:
        waits.append(seconds)
        return await real_wait(seconds)

    monkeypatch.setattr(store, "wait_for_work", wait_for_work)
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    try:
        job_id = await aclient.send("acme", **GOOD, send_at=datetime.now(UTC) + timedelta(milliseconds=600))
        await wait_for_async(lambda: len(worker.jobs) == 1, within=10, what="the scheduled job")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await asyncio.wait_for(dispatcher.drain(5), 10)
        await store.redis.aclose()
    record = redis_client.hgetall(KEYS.job(job_id))
    assert 0 <= int(record["queued_ms"]) - int(record["send_at_ms"]) < REAP_INTERVAL * 1000
    # Woken by the enqueue, it waited exactly until the job was due: at most the 600 ms
    # to its send time, and no more than that (not the reap interval).
    planned = [seconds for seconds in waits if seconds < REAP_INTERVAL - 5]
    assert planned and all(0 < seconds <= 0.6 for seconds in planned), waits


async def test_promote_reports_the_time_to_the_next_due_job(
    settings: Settings, aclient: AsyncMailClient
) -> None:
    lifecycle = Lifecycle(aclient._redis, KEYS, store_limits(settings))
    assert await lifecycle.promote_due() == (0, None)
    await aclient.send("acme", **GOOD, send_at=datetime.now(UTC) + timedelta(seconds=30))
    moved, due_in = await lifecycle.promote_due()
    assert moved == 0 and due_in is not None and 29 < due_in <= 30


# -- cancel ------------------------------------------------------------------------


def test_cancel_a_queued_or_scheduled_job(client: MailClient, redis_client: redis.Redis) -> None:
    queued = client.send("acme", **GOOD)
    kept = client.send("acme", **GOOD)
    scheduled = client.send("acme", **GOOD, send_at=in_an_hour())
    assert client.cancel(queued) == "queued"
    assert client.cancel(scheduled) == "scheduled"
    assert queue(redis_client) == [kept]
    assert redis_client.zcard(KEYS.scheduled()) == 0
    for job_id in (queued, scheduled):
        status = client.status(job_id)
        assert (status.state, status.dead_reason) == ("dead", "cancelled")
        assert redis_client.zscore(KEYS.dead(), job_id) is not None
        assert 0 < redis_client.ttl(KEYS.job(job_id)) <= client.settings.job_ttl
    # Twice is fine; an unknown id is not.
    assert client.cancel(queued) == "dead"
    with pytest.raises(UnknownJob):
        client.cancel("no-such-job")


async def test_cancel_a_claimed_job_frees_its_slot_and_too_late_once_dispatched(
    settings: Settings, aclient: AsyncMailClient, redis_client: redis.Redis
) -> None:
    store = JobStore(aclient._redis, KEYS, store_limits(settings))
    first, second = await aclient.send_many("acme", [Mail(**GOOD), Mail(**GOOD)])
    claimed = await store.claim(2)
    assert [job.id for job in claimed] == [first, second]
    assert await aclient.cancel(first) == "claimed"
    assert redis_client.zscore(KEYS.leases(), first) is None
    assert redis_client.zscore(KEYS.inflight("acme"), first) is None
    # The claimer hands both to SQS anyway: the cancelled one stays dead (the sender drops it).
    await store.handed_off([first, second])
    assert (await aclient.status(first)).state == "dead"
    assert redis_client.zscore(KEYS.inflight("acme"), first) is None
    with pytest.raises(TooLateToCancel) as caught:
        await aclient.cancel(second)
    assert caught.value.state == "dispatched"
    assert "too late to cancel" in str(caught.value)
    await store.finish(second, JobState.SENT)
    with pytest.raises(TooLateToCancel) as sent:
        await aclient.cancel(second)
    assert sent.value.state == "sent"


def test_cancel_is_too_late_while_a_sender_holds_the_job(
    client: MailClient, redis_client: redis.Redis
) -> None:
    # A copy of the job's message reached a sender while its record still says
    # queued (a dispatcher's lease ran out mid hand-off): the sender has claimed
    # it (mailer/daemon/send_claim.lua) and is sending it.
    job_id = client.send("acme", **GOOD)
    redis_client.set(KEYS.sending(job_id), "1", px=60_000)
    with pytest.raises(TooLateToCancel) as caught:
        client.cancel(job_id)
    assert caught.value.state == "sending"
    assert client.status(job_id).state == "queued"


def test_cli_cancel(
    client: MailClient, cli_env: None, capsys: pytest.CaptureFixture[str], redis_client: redis.Redis
) -> None:
    job_id = client.send("acme", **GOOD, send_at=in_an_hour())
    assert main(["cancel", job_id]) == 0
    assert "cancelled job" in capsys.readouterr().out
    assert main(["cancel", job_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"job_id": job_id, "cancelled": True, "was": "dead"}
    other = client.send("acme", **GOOD)
    redis_client.hset(KEYS.job(other), "state", "dispatched")
    assert main(["cancel", other]) == 1
    assert f"job {other} is dispatched: too late to cancel" in capsys.readouterr().err
    assert main(["cancel", "nope"]) == 1
    assert "no job with id 'nope'" in capsys.readouterr().err


# -- priorities ------------------------------------------------------------------------


async def test_a_high_job_behind_5000_low_ones_takes_the_next_slot(
    settings: Settings, aclient: AsyncMailClient, redis_client: redis.Redis
) -> None:
    store = JobStore(aclient._redis, KEYS, store_limits(settings))
    await store.sync_tenant_settings({}, {"acme": 5})
    low = await aclient.send_many("acme", [Mail(**GOOD)] * 5000, priority="low")
    first = await store.claim(10)
    assert [job.id for job in first] == low[:5]  # the in-flight cap: 5
    await store.handed_off([job.id for job in first])
    high = await aclient.send("acme", **GOOD, priority="high")
    await store.finish(first[0].id, JobState.SENT)
    assert [job.id for job in await store.claim(10)] == [high]
    assert redis_client.llen(KEYS.queue("acme", "low")) == 4995


# -- retention ---------------------------------------------------------------------------


async def test_finished_jobs_and_their_content_expire(
    settings: Settings, aclient: AsyncMailClient, redis_client: redis.Redis
) -> None:
    store = JobStore(aclient._redis, KEYS, store_limits(settings))
    pdf = Attachment("a.pdf", "application/pdf", b"%PDF-1.4 tiny")
    sent, dead = await aclient.send_many(
        "acme", [Mail(**GOOD, attachments=[pdf]), Mail(**GOOD, attachments=[pdf])]
    )
    for job_id in (sent, dead):  # waiting: kept without a TTL
        assert redis_client.ttl(KEYS.job(job_id)) == -1
        assert redis_client.ttl(KEYS.content(job_id)) == -1
    await store.claim(2)
    await store.handed_off([sent, dead])
    await store.finish(sent, JobState.SENT, keep_seconds=settings.job_ttl)
    await store.finish(dead, JobState.DEAD, keep_seconds=settings.job_ttl, fields={"dead_reason": "x"})
    # Sent: metadata only, for FAIRPOST_JOB_TTL; the content is gone at once.
    assert "payload" not in redis_client.hgetall(KEYS.job(sent))
    assert not redis_client.exists(KEYS.content(sent))
    assert 0 < redis_client.ttl(KEYS.job(sent)) <= settings.job_ttl
    # Dead: everything kept (replayable) for FAIRPOST_JOB_TTL.
    assert 0 < redis_client.ttl(KEYS.job(dead)) <= settings.job_ttl
    assert 0 < redis_client.ttl(KEYS.content(dead)) <= settings.job_ttl
    # A replay keeps it again until it finishes.
    with DeadLetters(settings) as letters:
        letters.replay(dead)
    assert redis_client.ttl(KEYS.job(dead)) == -1
    assert redis_client.ttl(KEYS.content(dead)) == -1


def test_dead_letter_ids_whose_records_expired_are_dropped(
    client: MailClient, redis_client: redis.Redis
) -> None:
    job_id = client.send("acme", **GOOD)
    client.cancel(job_id)
    redis_client.delete(KEYS.job(job_id))  # as if its TTL ran out
    assert client.dead_letters().list() == []
    assert redis_client.zcard(KEYS.dead()) == 0


def test_redis_memory_per_waiting_job_is_small(redis_url: str) -> None:
    from bench.job_memory import measure

    result = measure(redis_url, jobs=2000)
    # docs/operations.md quotes the figure (bench/job_memory.py); this keeps it honest.
    assert 300 < result["bytes_per_job"] < 2000, result


# -- dead letters (SDK and CLI) ---------------------------------------------------------------


def make_dead(client: MailClient, redis_client: redis.Redis, tenant: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        job_id = client.send(tenant, **{**GOOD, "subject": f"{tenant}-{i}"})
        client.cancel(job_id)
        ids.append(job_id)
    return ids


def add_poison(redis_client: redis.Redis, tenant: str = "acme") -> str:
    """What the sender writes for an unreadable SQS message
    (fairpost.mailer.daemon.mail_jobs.MailJobs.record_dead)."""
    job_id = "poison-1234"
    now = int(time.time() * 1000)
    redis_client.hset(
        KEYS.job(job_id),
        mapping={"tenant": tenant, "kind": "mail", "state": "dead", "priority": "normal",
                 "created_ms": now, "finished_ms": now, "dead_reason": "unreadable SQS message: x",
                 "last_error": "unreadable SQS message: x", "raw_body": "not json", "attempts": 0},
    )  # fmt: skip
    redis_client.zadd(KEYS.dead(), {job_id: now})
    return job_id


def test_dead_letters_list_show_replay_purge(client: MailClient, redis_client: redis.Redis) -> None:
    acme = make_dead(client, redis_client, "acme", 3)
    globex = make_dead(client, redis_client, "globex", 2)
    poison = add_poison(redis_client)
    dead = client.dead_letters()
    assert {d.job_id for d in dead.list()} == {poison, *globex, *acme}
    assert {d.job_id for d in dead.list("globex")} == set(globex)
    assert len(dead.list(limit=2)) == 2
    letter = dead.show(acme[0])
    assert (letter.tenant_id, letter.reason, letter.attempts) == ("acme", "cancelled", 0)
    assert letter.replayable
    assert letter.died_at is not None and letter.created_at is not None
    assert not dead.show(poison).replayable and dead.show(poison).raw_body == "not json"
    with pytest.raises(UnknownJob):
        dead.show(client.send("acme", **GOOD))  # not dead

    # Replay one: back at the tail of its queue, attempts from 0, counted.
    redis_client.hset(KEYS.job(acme[0]), "attempts", 4)
    dead.replay(acme[0])
    status = client.status(acme[0])
    assert (status.state, status.attempts, status.replays, status.dead_reason) == ("queued", 0, 1, None)
    assert queue(redis_client)[-1] == acme[0]
    with pytest.raises(NotReplayable, match="it is queued, not a dead letter"):
        dead.replay(acme[0])
    with pytest.raises(NotReplayable, match="no content to send"):
        dead.replay(poison)
    with pytest.raises(UnknownJob):
        dead.replay("nope")

    # Replay a tenant: the poison message is reported, not replayed.
    report = dead.replay_tenant("acme")
    assert sorted(report.replayed) == sorted(acme[1:])
    assert list(report.not_replayable) == [poison]
    assert {d.job_id for d in dead.list()} == {poison, *globex}

    # Purge: by tenant, by age, everything; a replayed job is never purged.
    with pytest.raises(ValueError, match="purge needs"):
        dead.purge()
    assert dead.purge(older_than=timedelta(hours=1)) == 0
    assert dead.purge(tenant="globex") == 2
    assert not any(redis_client.exists(KEYS.job(j)) for j in globex)
    assert dead.purge(everything=True) == 1
    assert dead.list() == []
    assert client.status(acme[0]).state == "queued"


def test_cli_dead_commands(
    client: MailClient, redis_client: redis.Redis, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    acme = make_dead(client, redis_client, "acme", 2)
    globex = make_dead(client, redis_client, "globex", 1)
    poison = add_poison(redis_client, "globex")

    assert main(["dead", "list"]) == 0
    out = capsys.readouterr().out
    assert "REASON" in out and all(j in out for j in [*acme, *globex, poison])
    assert main(["dead", "list", "--tenant", "acme", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {d["job_id"] for d in listed} == set(acme)
    assert listed[0]["reason"] == "cancelled" and listed[0]["attempts"] == 0

    assert main(["dead", "show", acme[0], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tenant_id"] == "acme"
    assert main(["dead", "show", "nope"]) == 1
    capsys.readouterr()

    assert main(["dead", "replay"]) == 2
    assert main(["dead", "replay", acme[0], "--all"]) == 2
    capsys.readouterr()
    assert main(["dead", "replay", acme[0]]) == 0
    assert "replayed job" in capsys.readouterr().out
    assert main(["dead", "replay", poison]) == 1
    assert "cannot be replayed" in capsys.readouterr().err
    assert main(["dead", "replay", "--tenant", "globex", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replayed"] == globex and list(report["not_replayable"]) == [poison]
    assert main(["dead", "replay", "--all"]) == 0
    assert "replayed 1 dead letters" in capsys.readouterr().out  # acme[1]

    make_dead(client, redis_client, "acme", 2)
    assert main(["dead", "purge"]) == 2
    with pytest.raises(SystemExit):
        main(["dead", "purge", "--older-than", "soon"])
    capsys.readouterr()
    assert main(["dead", "purge", "--older-than", "1h"]) == 0
    assert "purged 0 dead letters" in capsys.readouterr().out
    assert main(["dead", "purge", "--tenant", "acme", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"purged": 2}
    assert main(["dead", "purge", "--all"]) == 0
    assert "purged 1 dead letters" in capsys.readouterr().out  # the poison message
    assert main(["dead", "list"]) == 0
    assert "no dead letters" in capsys.readouterr().out


def test_cli_send_with_lifecycle_options(
    client: MailClient, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["send", "--tenant", "acme", "--from", "app@example.com", "--to", "ada@example.org",
            "--subject", "s", "--text", "t", "--idempotency-key", "k1", "--send-at", "+1h",
            "--header", "X-Campaign: spring"]  # fmt: skip
    assert main(args) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == job_id
    status = client.status(job_id)
    assert status.state == "scheduled" and status.scheduled_for is not None
    assert 3590 < (status.scheduled_for - datetime.now(UTC)).total_seconds() <= 3600
    naive = ["send", "--tenant", "acme", "--from", "app@example.com", "--to", "ada@example.org",
             "--subject", "s", "--text", "t", "--send-at", "2030-01-01T09:00:00"]  # fmt: skip
    assert main(naive) == 1
    assert "send_at: must be timezone-aware" in capsys.readouterr().err
    assert main([*naive[:-1], "2030-01-01T09:00:00+01:00"]) == 0


# -- end to end: SDK → Redis → dispatcher → SQS (moto) → sender → SES ----------------------------


async def state_is(client: AsyncMailClient, job_id: str, state: str) -> bool:
    return (await client.status(job_id)).state == state


@pytest.mark.usefixtures("ses_env")
async def test_scheduled_mail_is_sent_when_due_and_a_cancelled_one_never(
    redis_url: str, ses: SesServer
) -> None:
    settings = quick_settings(redis_url)
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        send_at = datetime.now(UTC) + timedelta(seconds=1.5)
        kept = await client.send("acme", **GOOD, send_at=send_at)
        cancelled = await client.send("acme", **GOOD, send_at=send_at)
        assert await client.cancel(cancelled) == "scheduled"
        await wait_for_async(
            lambda: state_is(client, kept, JobState.SENT), within=15, what="the scheduled mail"
        )
        record = await run.store.job(kept)
    assert [m.job_id for m in ses.sent] == [kept]
    assert ses.sent[0].wall_time >= send_at.timestamp() - 0.05
    assert 0 <= int(record["queued_ms"]) - int(record["send_at_ms"]) <= 1000


@pytest.mark.usefixtures("ses_env")
async def test_a_high_job_behind_5000_low_ones_is_sent_within_the_next_few_slots(
    redis_url: str, ses: SesServer
) -> None:
    cap = 5
    settings = quick_settings(redis_url, inflight_cap=cap)
    async with AsyncMailClient(settings) as client:
        low = await client.send_many("acme", [Mail(**GOOD)] * 5000, priority="low")
        async with pipeline(settings) as run:
            await wait_for_async(lambda: ses.sent_count >= 3 * cap, within=30, what="the low backlog to flow")
            high = await client.send("acme", **GOOD, priority="high")
            await wait_for_async(
                lambda: state_is(client, high, JobState.SENT), within=20, what="the high mail"
            )
            records = {j: await run.store.job(j) for j in [*low[: ses.sent_count + 2 * cap], high]}
        order = [m.job_id for m in ses.sent]
    enqueued, claimed = int(records[high]["created_ms"]), int(records[high]["claimed_ms"])
    # The high mail takes the tenant's next free slot: no low mail is claimed after
    # it was enqueued and before it. (What was already in flight, at most the cap, may
    # still reach SES first.)
    overtaking = [
        j for j in low if j in records and enqueued < int(records[j].get("claimed_ms") or 0) < claimed
    ]
    assert overtaking == [], f"{len(overtaking)} low mails were claimed after the high one was enqueued"
    assert set(order) - {high} <= set(low)


@pytest.mark.usefixtures("ses_env")
async def test_a_dead_letter_replays_through_the_normal_path(redis_url: str, ses: SesServer) -> None:
    settings = quick_settings(redis_url)
    ses.fail_next(1, Faults.MESSAGE_REJECTED)
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        job_id = await client.send("acme", **GOOD)
        await wait_for_async(
            lambda: state_is(client, job_id, JobState.DEAD), within=15, what="the dead letter"
        )
        sqs = boto3.client("sqs")
        sqs.send_message(QueueUrl=run.queue_url, MessageBody="not json", MessageGroupId="acme",
                         MessageDeduplicationId="poison")  # fmt: skip
        dead = DeadLetters(settings)
        try:
            await wait_for_async(
                lambda: len(dead.list()) == 2, within=15, what="the poison message's dead letter"
            )
            letter = dead.show(job_id)
            assert "MessageRejected" in letter.reason and letter.last_error
            report = dead.replay_all()
        finally:
            dead.close()
        assert report.replayed == [job_id]
        assert [k.startswith("poison-") for k in report.not_replayable] == [True]
        await wait_for_async(
            lambda: state_is(client, job_id, JobState.SENT), within=15, what="the replayed mail"
        )
        status = await client.status(job_id)
        usage = await run.quota.usage("acme", settings.limits_for("acme"))
    assert (status.replays, status.attempts, status.dead_reason) == (1, 0, None)
    assert [m.job_id for m in ses.sent] == [job_id]
    assert [used for _, used in usage] == [1]  # the replay went through the quota
