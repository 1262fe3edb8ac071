"""bench.shard_replay: MONITOR's record of a real store's commands replays to the same work."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from bench.cluster import BenchError
from bench.redis_profile import script_names, script_sources
from bench.script_costs import DUMPED, START, annotate, by_kind, by_script, dump_totals
from bench.shard_replay import (
    Recorder,
    absolute_lease,
    callgrind_replay,
    instructions,
    lease_at,
    parse_monitor_line,
    replay,
)
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.daemon.mail_jobs import MailJobs
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import RedisServer, redis_server


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A server of the test's own: MONITOR sees only what the test sends."""
    with redis_server() as srv:
        yield srv


def recorded(server: RedisServer) -> Recorder:
    """A recorder whose MONITOR has started, on a server with fairpost's scripts
    loaded (as the bench's warm-up leaves it): it has seen an ECHO sent after it."""
    recorder = Recorder(server.port)
    client = redis.Redis(port=server.port)
    try:
        for _, source in script_sources().values():
            client.script_load(source)
        recorder.mark(client, "start")
    except BaseException:
        recorder.stop()
        raise
    finally:
        client.close()
    return recorder


def test_monitor_lines_give_back_the_exact_arguments(server: RedisServer) -> None:
    recorder = recorded(server)
    odd = b'a "quoted" value\r\nwith a \\ backslash, \x00\xff bytes and spaces'
    client = redis.Redis(port=server.port)
    try:
        client.set("key with spaces", odd)
        client.eval("redis.call('GET', KEYS[1]); return 1", 1, "key with spaces")
        recorder.mark(client, "end")
    finally:
        client.close()
    commands = [c for c in recorder.stop() if c[0] != b"ECHO"]
    assert commands[-2] == [b"SET", b"key with spaces", odd]
    # The script's own GET is not recorded: replaying the EVAL runs it again.
    assert commands[-1] == [b"EVAL", b"redis.call('GET', KEYS[1]); return 1", b"1", b"key with spaces"]
    assert parse_monitor_line(b"+OK") is None


def recorded_drain(server: RedisServer) -> list[list[bytes]]:
    """What a real store sends for three mails of one tenant, enqueue to sent, as MONITOR saw it."""
    keys = MailKeys("replay")
    recorder = recorded(server)

    async def drain() -> None:
        client = redis.asyncio.Redis(port=server.port)
        try:
            store = JobStore(client, keys, StoreLimits(default_cap=10))
            jobs = [NewJob(id=f"j{i}", tenant="acme", kind="mail", payload="{}") for i in range(3)]
            await store.enqueue(jobs)
            claimed = await store.claim(10)
            # As the dispatcher hands off: with when the claims were made.
            await store.handed_off([job.id for job in claimed], claimed_ms=min(j.claimed_ms for j in claimed))
            async with store.pipeline() as pipe:
                await MailJobs(store).record_sent(
                    [(job.id, "m") for job in claimed], keep_seconds=60, pipeline=pipe
                )
                await pipe.execute()
            assert {job.id for job in claimed} == {"j0", "j1", "j2"}
            assert await client.hget(keys.job("j0"), "state") == b"sent"
        finally:
            await client.aclose()

    asyncio.run(drain())
    check = redis.Redis(port=server.port)
    try:
        recorder.mark(check, "end")
    finally:
        check.close()
    return [c for c in recorder.stop() if c[0] != b"ECHO"]


def test_a_hand_off_is_replayed_as_young_as_it_was_recorded(server: RedisServer) -> None:
    # Within its claims' lease a hand-off writes less (handoff.lua): replayed minutes
    # after the capture with the lease end recorded, every one would take the other path.
    commands = recorded_drain(server)
    [handoff] = [c for c in commands if lease_at(c) is not None]
    at = lease_at(handoff)
    assert at is not None and handoff[at].startswith(b"@")
    lease_ms = StoreLimits().lease_ms
    assert 0 < int(handoff[at][1:]) <= lease_ms
    before = time.time() * 1000
    replayed = int(absolute_lease(handoff)[at])
    assert before < replayed <= time.time() * 1000 + lease_ms
    # Other commands go as they came.
    assert all(absolute_lease(c) is c for c in commands if c is not handoff)


def test_a_recorded_drain_replays_to_its_mails_sent_and_nothing_less(server: RedisServer) -> None:
    commands = recorded_drain(server)
    run = replay(commands, depth=10, mails=3)
    assert run.cpu >= 0 and run.usec["evalsha"] > 0 and run.set_cpu is None
    # Without its last script call (the sent records) the replay has not done the drain's work.
    last = max(i for i, c in enumerate(commands) if c[0] == b"EVALSHA")
    with pytest.raises(RuntimeError, match="finished 0 mails as sent, not 3"):
        replay(commands[:last] + commands[last + 1 :], depth=10, mails=3)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_replay_under_callgrind_counts_the_same_instructions_twice(server: RedisServer) -> None:
    commands = recorded_drain(server)
    first, second = instructions(commands, mails=3), instructions(commands, mails=3)
    assert first > 0 and abs(first - second) / first < 0.01, (first, second)


@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="redis-benchmark is not installed")
def test_a_mail_is_weighed_against_redis_benchmarks_sets_on_the_same_server(server: RedisServer) -> None:
    run = replay(recorded_drain(server), depth=10, mails=3, reference=True)
    assert run.set_cpu is not None and run.set_cpu > 0
    # A mail is a score of commands and a few scripts: many SETs' worth, never one.
    assert run.cpu / 3 > 5 * run.set_cpu, (run.cpu, run.set_cpu)


@pytest.mark.skipif(shutil.which("callgrind_annotate") is None, reason="valgrind is not installed")
def test_a_replays_instructions_split_by_script_and_by_kind_add_up(server: RedisServer) -> None:
    commands = recorded_drain(server)
    names = script_names()
    with callgrind_replay(commands, mails=3, options=DUMPED) as out:
        dumps, _ = dump_totals(out)
    with callgrind_replay(commands, mails=3) as out:
        annotated = annotate(out)
    scripts = by_script(commands, dumps, names, len(script_sources()))
    calls = {names[c[1].decode()] for c in commands if c[0] == b"EVALSHA"}
    assert set(scripts) == {START, *calls} and "dispatcher/finish.lua" in calls
    assert all(count > 0 for count in scripts.values()), scripts
    kinds = by_kind(annotated)
    assert all(count > 0 for count in kinds.values()), kinds
    # The kinds part the whole program's count: their sum is the annotation's total.
    program = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", annotated)
    assert program is not None
    total = int(program.group(1).replace(",", ""))
    assert sum(kinds.values()) == total
    # ... and so do the scripts' dumps, within the cost of dumping (another replay).
    assert abs(sum(scripts.values()) - total) / total < 0.05, (sum(scripts.values()), total)
    with pytest.raises(BenchError, match="1 dumps for"):
        by_script(commands, dumps[:1], names, len(script_sources()))
