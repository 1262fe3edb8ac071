"""What finish.lua writes of a sent job in the history, and where: its line, byte
for byte as history.lua's layout says (another version reads it), in the bucket
picked from a hash its caller makes (calls.history_hash) where history.lua's
readers make it themselves (history_bucket, from Redis's SHA-1): the two must
agree, or a line is written where no reader looks. Real redis-server and the
real scripts.
"""

from __future__ import annotations

import uuid

import redis.asyncio

from fairpost.dispatcher import JobState, JobStore, NewJob
from fairpost.dispatcher.calls import history_hash
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.store import StoreLimits

KEEP = 7 * 86400
SHARDS = 37
"""Buckets a day: more than the lines of the test, so each line's bucket is its own choice."""

LUA_HASH = """
local out = {}
for i, id in ipairs(ARGV) do
  out[i] = tonumber(string.sub(redis.sha1hex(id), 1, 8), 16)
end
return out
"""
"""What history.lua's history_bucket takes modulo a day's buckets, for each id in ARGV."""


async def test_the_callers_hash_is_the_one_the_readers_make(aredis: redis.asyncio.Redis) -> None:
    ids = [uuid.uuid4().hex for _ in range(500)] + ["a", "", "job-é", "x" * 200, "0" * 32]
    lua = await aredis.eval(LUA_HASH, 0, *ids)
    assert [int(n) for n in lua] == [history_hash(i) for i in ids]
    # Some of them at or past 2^31: the hash is unsigned.
    assert any(history_hash(i) >= 2**31 for i in ids)


async def test_a_line_is_found_where_the_readers_look(aredis: redis.asyncio.Redis) -> None:
    keys = Keys("hashed")
    store = JobStore(aredis, keys, StoreLimits(default_cap=100, detail_seconds=3600, history_shards=SHARDS))
    ids = [uuid.uuid4().hex for _ in range(20)]
    await store.enqueue([NewJob(id=i, tenant="t1", kind="task", payload="{}") for i in ids])
    assert sorted(job.id for job in await store.claim(len(ids))) == sorted(ids)
    await store.handed_off(ids)
    async with store.pipeline() as pipe:
        await store.finish_all([(i, {}) for i in ids], JobState.SENT, keep_seconds=KEEP, pipeline=pipe)
        await pipe.execute()
    buckets = await aredis.keys(keys.history_prefix() + "*")
    assert len(buckets) > 5  # the lines spread over the day's buckets
    # Past their detail TTL (stood in for by deleting the records): each found by
    # history_find (history_read.lua) through status().
    await aredis.delete(*(keys.job(i) for i in ids))
    for job_id in ids:
        kept = await store.job(job_id)
        assert (kept["state"], kept["tenant"]) == ("sent", "t1"), job_id


async def test_a_line_is_its_layout_byte_for_byte(aredis: redis.asyncio.Redis) -> None:
    keys = Keys("exact")
    store = JobStore(aredis, keys, StoreLimits(default_cap=100, detail_seconds=3600))
    await store.enqueue([NewJob(id="a", tenant="t1", kind="task", payload="{}", priority="high")])
    assert [job.id for job in await store.claim(1)] == ["a"]
    await store.handed_off(["a"])
    assert await store.finish("a", JobState.SENT, keep_seconds=KEEP, fields={"attempts": "3"}) == 1
    whole = await store.job("a")
    [bucket] = await aredis.keys(keys.history_prefix() + "*")
    created = int(whole["created_ms"])
    after = [int(whole[name]) - created for name in ("dispatched_ms", "finished_ms")]
    # priority, created_ms, dispatched_ms and finished_ms (as ms after created_ms), attempts
    assert text(await aredis.hget(bucket, "a")) == f"1|sent|t1|high|{created}|{after[0]}|{after[1]}|3"
