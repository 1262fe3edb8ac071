"""The units of answered mails move to the answer only when that moves them
(fairpost.mailer.daemon.counting.Counting.move_to_answers): an answer that came
within the grant's bucket in every window leaves them where they count a window
past it already, and Redis is spared the restamp. A real quota engine and
redis-server; the sender's context is the unit tests' fake but for the engine.
"""

from __future__ import annotations

import time

import redis.asyncio

from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.counting import Counting, Stamp
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.keys import MailKeys
from tests.daemon.unit.fakes import fake_context, mail

SENT = ses.SendResult(ses.Verdict.SENT, message_id="ses-1")


async def queued_restamps(aredis: redis.asyncio.Redis, limits: str, stamps: list[Stamp]) -> int:
    """How many restamps a group of mails answered now, each under its stamp, queues."""
    ctx, _, _ = fake_context(global_limits=limits, tenant_limits=limits)
    ctx.quota = QuotaEngine(aredis, MailKeys("fp-test"))
    answered = [(mail("acme", n), SENT, stamp) for n, stamp in enumerate(stamps)]
    async with aredis.pipeline(transaction=False) as pipe:
        await Counting(ctx).move_to_answers("acme", answered, pipe)
        queued = len(pipe.command_stack)
        await pipe.execute()
    return queued


async def test_answers_within_the_grants_bucket_queue_no_restamp(aredis: redis.asyncio.Redis) -> None:
    grant = await QuotaEngine(aredis, MailKeys("fp-test")).acquire("acme", [1, 1], (), ())
    assert grant.asked_mono is not None
    # A day's bucket is 28.8 minutes: answered a moment after the grant, at its start.
    at_ms = grant.at_ms - grant.at_ms % 1_728_000
    stamps = [Stamp(at_ms, time.monotonic(), since=time.monotonic()) for _ in range(2)]
    assert await queued_restamps(aredis, "1000/day", stamps) == 0


async def test_answers_past_the_grants_bucket_are_restamped(aredis: redis.asyncio.Redis) -> None:
    now = time.monotonic()
    # Asked 50 ms ago: past the end of a second's 20 ms bucket, wherever it started.
    assert await queued_restamps(aredis, "1000/second", [Stamp(1_000_000, now, since=now - 0.05)]) == 1
    # At the last ms of a day's bucket, asked a moment ago: the answer may be in the next.
    last = 1_728_000 - 1
    assert await queued_restamps(aredis, "1000/day", [Stamp(last, now, since=now - 0.001)]) == 1


async def test_a_stamp_without_its_asking_moment_is_restamped(aredis: redis.asyncio.Redis) -> None:
    # Unknown when the grant was asked for: nothing bounds the answer's time.
    assert await queued_restamps(aredis, "1000/day", [Stamp(0, time.monotonic())]) == 1
    # Two mails in one bucket, one of them unknown: their one restamp is queued.
    now = time.monotonic()
    assert await queued_restamps(aredis, "1000/day", [Stamp(0, now, since=now), Stamp(0, now)]) == 1
