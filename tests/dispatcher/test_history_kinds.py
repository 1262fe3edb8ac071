"""The history of finished jobs serves any job kind: the fields a line keeps are the
kind's (``Keys.history_fields``), and a later outcome goes on a line by the kind's
ranking (dispatcher/history.py). Real redis-server and the real scripts; a
record's expiry is stood in for by deleting it once its TTL is checked. Nothing
here imports ``fairpost.mailer``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio

from fairpost.dispatcher import JobState, JobStore, NewJob
from fairpost.dispatcher.history import record_of_line
from fairpost.dispatcher.journal import Journal
from fairpost.dispatcher.keys import HistoryField, Keys, pack_history
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.store import StoreLimits

DETAIL, KEEP = 3600, 7 * 86400
LIMITS = StoreLimits(default_cap=100, detail_seconds=DETAIL, history_shards=2)
RANK = ("ok", "late", "lost")
"""The task kind's outcomes, least bad first."""


@dataclass(frozen=True)
class ReportKeys(Keys):
    """A kind whose line keeps, beside the dispatcher's fields, a report and its reason."""

    def history_fields(self) -> tuple[HistoryField, ...]:
        return (*super().history_fields(), HistoryField("report", "none"), HistoryField("reason"))


async def finished(store: JobStore, job_id: str, fields: dict[str, str], priority: str = "normal") -> None:
    """The job enqueued, claimed, handed off and finished sent; its record then expired."""
    new = NewJob(id=job_id, tenant="t1", kind="task", payload="{}", priority=priority, fields=fields)
    await store.enqueue([new])
    assert [job.id for job in await store.claim(1)] == [job_id]
    await store.handed_off([job_id])
    assert await store.finish(job_id, JobState.SENT, keep_seconds=KEEP) == 1
    assert 0 < await store.redis.ttl(store.keys.job(job_id)) <= DETAIL
    assert await store.redis.delete(store.keys.job(job_id)) == 1


async def test_a_kind_that_names_no_fields_keeps_the_dispatchers_own(aredis: redis.asyncio.Redis) -> None:
    store = JobStore(aredis, Keys("plain"), LIMITS)
    await finished(store, "a", {"report": "ok"}, priority="high")
    kept = await store.job("a")
    times = {"created_ms", "dispatched_ms", "finished_ms", "sent_ms"}
    assert set(kept) == {"state", "tenant", "priority", *times}
    assert (kept["state"], kept["tenant"], kept["priority"]) == ("sent", "t1", "high")
    assert int(kept["created_ms"]) <= int(kept["dispatched_ms"]) <= int(kept["finished_ms"])
    assert kept["sent_ms"] == kept["finished_ms"]


async def test_a_kinds_fields_are_kept_and_its_outcome_keeps_the_worst(aredis: redis.asyncio.Redis) -> None:
    store = JobStore(aredis, ReportKeys("reports"), LIMITS)
    await finished(store, "a", {"report": "ok", "reason": "on time"})
    assert (await store.job("a"))["report"] == "ok"
    history = store.history
    assert await history.outcome("a", ("report", "lost"), RANK, also={"reason": "timed out"}) == 1
    # A less bad outcome told later changes nothing; a worse one or the same replaces it.
    assert await history.outcome("a", ("report", "late"), RANK, also={"reason": "slow"}) == 0
    kept = await store.job("a")
    assert (kept["report"], kept["reason"]) == ("lost", "timed out")
    assert await history.outcome("a", ("report", "lost"), RANK, also={"reason": ""}) == 1
    assert "reason" not in await store.job("a")
    assert await history.outcome("nobody", ("report", "lost"), RANK) == -1


async def test_a_field_at_its_default_is_left_out_of_the_line(aredis: redis.asyncio.Redis) -> None:
    keys = ReportKeys("defaults")
    store = JobStore(aredis, keys, LIMITS)
    await finished(store, "a", {"report": "none"})
    [bucket] = await aredis.keys(keys.history_prefix() + "*")
    line = text(await aredis.hget(bucket, "a"))
    # priority, attempts and report at their defaults, no reason: all left out
    parts = line.split("|")
    assert parts[:4] == ["1", "sent", "t1", ""] and parts[-3:] == ["", "", ""]
    record = record_of_line(line, keys.history_fields())
    assert record["state"] == "sent" and {"priority", "attempts", "report", "reason"}.isdisjoint(record)
    assert record_of_line(line, Keys().history_fields()) == {}  # written with other fields


async def test_an_outcome_names_only_fields_the_line_keeps(aredis: redis.asyncio.Redis) -> None:
    store = JobStore(aredis, Keys("plain"), LIMITS)
    with pytest.raises(ValueError, match="'report'"):
        await store.history.outcome("a", ("report", "lost"), RANK)


def test_a_kinds_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="name 'a,b'"):
        HistoryField("a,b")
    with pytest.raises(ValueError, match=re.escape("default 'x|y'")):
        HistoryField("a", "x|y")
    with pytest.raises(ValueError, match="once"):
        pack_history((HistoryField("a"), HistoryField("a")))
    with pytest.raises(ValueError, match="created_ms"):
        pack_history((HistoryField("done_ms", after_created=True),))


@pytest.mark.parametrize(
    "copy",
    [("tenant", "state", "finished_ms", "priority"), ("tenant",), ()],
)
async def test_a_finish_copies_and_keeps_what_a_read_after_it_would_give(
    aredis: redis.asyncio.Redis, copy: tuple[str, ...]
) -> None:
    # The journal's entry copies, and the line keeps, the record's fields as they
    # are once the finish has written (its state, its finished_ms), however the
    # journal's copied fields and the history's fields overlap.
    keys = Keys(f"copy{len(copy)}")
    store = JobStore(aredis, keys, dataclasses.replace(LIMITS, journal_max_length=100))
    store._calls.journal = Journal(keys.outcomes(), 100, 0, copy)
    new = NewJob(id="a", tenant="t1", kind="task", payload="{}", priority="high", fields={"attempts": "2"})
    await store.enqueue([new])
    assert [job.id for job in await store.claim(1)] == ["a"]
    await store.handed_off(["a"])
    assert await store.finish("a", JobState.SENT, keep_seconds=KEEP, fields={"attempts": "3"}) == 1
    whole = await store.job("a")
    entries: Any = await aredis.xrange(keys.outcomes())
    [(_, entry)] = entries
    got = {text(k): text(v) for k, v in entry.items()}
    assert got == {"job": "a", "state": "sent"} | {name: whole[name] for name in copy}
    assert await aredis.delete(keys.job("a")) == 1
    kept = await store.job("a")
    assert {name: kept.get(name) for name in ("state", "priority", "attempts", "finished_ms")} == {
        "state": "sent",
        "priority": "high",
        "attempts": "3",
        "finished_ms": whole["finished_ms"],
    }
