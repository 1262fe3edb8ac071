"""The SDK's feed readers (``client.events``): consumer groups, at least once, resumable.

A real redis-server; the events are written by the real scripts (a dead letter
each, through the store), and read by the readers an application uses.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis.asyncio

from fairpost import AsyncMailClient, MailClient
from fairpost.config import Settings
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.store import JobStore, NewJob, store_limits
from fairpost.mailer.errors import InvalidInput
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.wait import wait_for

KEYS = MailKeys()


async def outcomes(settings: Settings, count: int, *, tenant: str = "acme", start: int = 0) -> list[str]:
    """``count`` events (a job of ``tenant`` dead each); their job ids, in order."""
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    try:
        store = JobStore(client, KEYS, store_limits(settings))
        ids = [f"{tenant}-{i}" for i in range(start, start + count)]
        await store.enqueue([NewJob(id=i, tenant=tenant, kind="mail", payload="{}") for i in ids])
        for job_id in ids:
            await store.finish(job_id, JobState.DEAD, fields={"dead_reason": "test"})
    finally:
        await client.aclose()
    return ids


async def test_a_group_reads_each_event_once_and_never_again_once_acknowledged(
    settings: Settings, client: MailClient
) -> None:
    jobs = await outcomes(settings, 250)
    seen = []
    for event in client.events(group="billing", consumer="w1", block=False, batch=100):
        seen.append(event.job_id)
        event.ack()
    assert seen == jobs
    assert list(client.events(group="billing", consumer="w1", block=False)) == []
    assert list(client.events(group="billing", consumer="w2", block=False, claim_idle_seconds=0.001)) == []
    # Another group reads the whole feed for itself.
    assert [e.job_id for e in client.events(group="audit", consumer="a", block=False)] == jobs


async def test_a_consumer_that_restarts_gets_what_it_had_not_acknowledged_first(
    settings: Settings, client: MailClient
) -> None:
    jobs = await outcomes(settings, 10)
    first = client.events(group="billing", consumer="w1", block=False)
    read = first.read()
    assert [e.job_id for e in read] == jobs
    for event in read[:4]:
        event.ack()
    # w1 stops without a word; more happens meanwhile; w1 comes back under its name.
    later = await outcomes(settings, 3, start=10)
    again = [e.job_id for e in client.events(group="billing", consumer="w1", block=False)]
    assert again == jobs[4:] + later


async def test_another_consumer_takes_over_what_a_dead_one_left_pending(
    settings: Settings, client: MailClient
) -> None:
    jobs = await outcomes(settings, 5)
    assert len(client.events(group="billing", consumer="dies", block=False).read()) == 5
    taker = client.events(group="billing", consumer="w2", claim_idle_seconds=0.001, block=False)
    taken: list[str] = []

    def took_all() -> bool:
        for event in taker.read():
            taken.append(event.job_id)
            event.ack()
        return sorted(taken) == sorted(jobs)

    wait_for(took_all, within=5, what="w2 to take over the dead consumer's events")
    assert list(client.events(group="billing", consumer="dies", block=False)) == []


async def test_consumers_of_one_group_share_the_events(settings: Settings, client: MailClient) -> None:
    jobs = await outcomes(settings, 60)
    one = client.events(group="g", consumer="one", batch=7, block=False)
    two = client.events(group="g", consumer="two", batch=7, block=False)
    got: dict[str, list[str]] = {"one": [], "two": []}
    while True:
        batch = [(name, e) for name, reader in (("one", one), ("two", two)) for e in reader.read()]
        if not batch:
            break
        for name, event in batch:
            got[name].append(event.job_id)
            event.ack()
    assert got["one"] and got["two"]
    assert sorted(got["one"] + got["two"]) == sorted(jobs)


async def test_a_tenant_reader_sees_its_own_events_only(settings: Settings, client: MailClient) -> None:
    acme = await outcomes(settings, 5)
    globex = await outcomes(settings, 4, tenant="globex")
    mine = [e.job_id for e in client.events(group="billing", consumer="w", tenant="acme", block=False)]
    assert mine == acme
    # Its group is its own: a reader of the same group for another tenant still sees its events.
    theirs = [e.job_id for e in client.events(group="billing", consumer="w", tenant="globex", block=False)]
    assert theirs == globex


async def test_a_group_that_starts_late_reads_only_what_comes_after(
    settings: Settings, client: MailClient
) -> None:
    await outcomes(settings, 3)
    reader = client.events(group="late", consumer="w", start="latest", block=False)
    assert reader.read() == []
    later = await outcomes(settings, 2, start=3)
    assert [e.job_id for e in reader] == later


@pytest.mark.parametrize(
    ("option", "value"),
    [("group", "bad name"), ("consumer", ""), ("tenant", "a/b"), ("start", "now"), ("batch", 0)],
)
def test_bad_options_are_refused_naming_the_option(client: MailClient, option: str, value: object) -> None:
    options: dict[str, object] = {"group": "g", "consumer": "c", option: value}
    with pytest.raises(InvalidInput) as raised:
        client.events(**options)  # type: ignore[arg-type]
    assert raised.value.field == option


async def test_the_async_reader_waits_for_new_events_and_resumes(
    settings: Settings, aclient: AsyncMailClient
) -> None:
    reader = aclient.events(group="billing", consumer="w1")
    assert await reader.read() == []  # nothing yet: the blocking read ends empty-handed
    events = reader.__aiter__()
    waiting = asyncio.ensure_future(anext(events))
    [job_id] = await outcomes(settings, 1)
    event = await asyncio.wait_for(waiting, timeout=10)
    assert event.job_id == job_id and event.type == "mail.dead"
    await events.aclose()  # type: ignore[attr-defined]
    # Not acknowledged: read again by the same consumer after a restart; then acknowledged.
    again = await aclient.events(group="billing", consumer="w1", block=False).read()
    assert [e.id for e in again] == [event.id]
    await again[0].ack()
    assert [e async for e in aclient.events(group="billing", consumer="w1", block=False)] == []


CONSUMER = textwrap.dedent(
    """
    import sys
    import threading
    from fairpost import MailClient
    from fairpost.config import load_settings

    out = open(sys.argv[2], "a", buffering=1)
    # Stopped (to be killed) with its Nth event read and not acknowledged, when asked.
    stop_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    with MailClient(load_settings(redis_url=sys.argv[1])) as client:
        events = client.events(group="billing", consumer="w1", block=sys.argv[3] == "block")
        for n, event in enumerate(events, 1):
            out.write("got " + event.job_id + "\\n")
            if n == stop_at:
                threading.Event().wait()
            event.ack()
            out.write("acked " + event.job_id + "\\n")
    """
)


def test_every_event_is_read_at_least_once_across_a_sigkill_and_a_restart(
    settings: Settings, tmp_path: Path
) -> None:
    jobs = asyncio.run(outcomes(settings, 400))
    log = tmp_path / "consumer.log"
    log.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOST_")}

    def lines() -> list[tuple[str, str]]:
        return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines() if " " in line]  # type: ignore[misc]

    run = [sys.executable, "-c", CONSUMER, settings.redis_url, str(log)]
    # Killed mid-stream whatever the machine's speed: it stops itself at its 100th
    # event, read and not acknowledged (a kill after a count of lines raced a
    # consumer quick enough to read all 400 first).
    proc = subprocess.Popen([*run, "block", "100"], env=env)
    try:
        wait_for(lambda: len(lines()) >= 199, within=30, what="the consumer at its 100th event")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    before = lines()
    acked_before = {job for what, job in before if what == "acked"}
    unacked = {job for what, job in before if what == "got"} - acked_before
    assert len(acked_before) == 99 and len(unacked) == 1, before[-3:]
    subprocess.run([*run, "once"], env=env, check=True, timeout=60)
    after = lines()[len(before) :]
    read_after = [job for what, job in after if what == "got"]
    assert {job for what, job in lines() if what == "got"} == set(jobs)
    assert not acked_before & set(read_after), "an acknowledged event was read again"
    assert unacked <= set(read_after), "the event read and not acknowledged was not read again"
