"""enqueue.lua's answer for a job whose id exists: nothing written for it, whether the
record was written by an earlier call or earlier in the same batch, and the rest of
the batch written. enqueue.lua asks one EXISTS of every record first and each record
on its own only when one exists: both branches are taken here."""

from __future__ import annotations

import redis.asyncio

from fairpost.dispatcher import JobStore, NewJob
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.store import StoreLimits


def job(job_id: str, tenant: str) -> NewJob:
    return NewJob(id=job_id, tenant=tenant, kind="task", payload=f"payload of {job_id}")


async def test_a_job_whose_id_exists_is_not_written_and_the_rest_are(aredis: redis.asyncio.Redis) -> None:
    keys = Keys(prefix="enqueue-ids")
    store = JobStore(aredis, keys, StoreLimits())
    assert await store.enqueue([job("a", "t1"), job("b", "t1")]) == [True, True]
    # An id from an earlier call, a new one, and a new one given twice in the batch.
    assert await store.enqueue([job("c", "t2"), job("b", "t2"), job("d", "t2"), job("d", "t3")]) == [
        True,
        False,
        True,
        False,
    ]
    assert await aredis.hget(keys.job("b"), "tenant") == "t1"
    assert await aredis.hget(keys.job("d"), "tenant") == "t2"
    # A batch of new ids only: every one written.
    assert await store.enqueue([job("e", "t1"), job("f", "t2")]) == [True, True]
    assert await aredis.hget(keys.counts(), "t2") == "3"  # c, d and f wait
