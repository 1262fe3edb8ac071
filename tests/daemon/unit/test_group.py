"""One tenant's group: what is deleted, parked, handed back, retried or sent.

The group decision against fakes (tests/daemon/unit/fakes.py) for the job store
and the quota engine, and a stand-in for the sending (which has tests of its own
in the pipeline): each case asserts the settlement each message was given.
"""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.counting import Counting
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.group import GroupDecision
from fairpost.mailer.daemon.holds import PAUSED_RECHECK_SECONDS
from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.daemon.parking import PRECISE_SAFETY_NET, Parking
from fairpost.mailer.daemon.settlement import HAND_BACK, Delete, Park, TimedRetry
from fairpost.mailer.quota.engine import NEVER, Grant
from fairpost.mailer.quota.overrides import StaticLimits
from tests.daemon.unit.fakes import FakeQuota, FakeStore, fake_context, mail


class _Sending:
    """Takes the granted mails (their sending is the pipeline tests')."""

    def __init__(self) -> None:
        self.granted: list[Received] = []

    async def send_granted(
        self, tenant: str, granted: list[Received], at_ms: int, asked: float | None
    ) -> None:
        self.granted += granted


class _Paused(StaticLimits):
    def is_paused(self, tenant: str) -> bool:
        return True


def decision(ctx: SenderContext, quota: FakeQuota) -> tuple[GroupDecision, _Sending, Gate]:
    sending = _Sending()
    gate = Gate(cast(Any, quota), ctx.limits)
    endings = Endings(ctx)
    parking = Parking(ctx, gate, endings)
    groups = GroupDecision(ctx, gate, Counting(ctx), endings, cast(Any, sending), parking)
    return groups, sending, gate


def setup(**settings: Any) -> tuple[SenderContext, FakeStore, FakeQuota, GroupDecision, _Sending, Gate]:
    ctx, store, quota = fake_context(**settings)
    groups, sending, gate = decision(ctx, quota)
    return ctx, store, quota, groups, sending, gate


async def test_a_second_copy_is_deleted_and_finished_jobs_are_left_to_their_claim() -> None:
    # No state is read on the way to a send: the claim (send_claim.lua) deletes a
    # finished job's message and gives its units back (send.py, test_sender.py).
    _, store, quota, groups, sending, _ = setup()
    store.states["j-0"] = str(JobState.SENT)
    group = [mail("acme", 0), mail("acme", 1), mail("acme", 1)]
    quota.grant = Grant(granted=2, retry_after=0.0, blocked_by=None, at_ms=5)
    await groups.handle("acme", group)
    assert group[2].settlement == Delete("duplicate")
    assert sending.granted == group[:2]
    assert quota.asked == [("acme", [1, 1])]
    assert store.state_reads == []


async def test_a_held_tenants_finished_jobs_are_deleted_not_parked() -> None:
    ctx, store, quota, groups, _, _ = setup()
    ctx.limits = _Paused(ctx.settings)
    store.states["j-0"] = str(JobState.SENT)
    group = [mail("acme", 0), mail("acme", 1)]
    await groups.handle("acme", group)
    assert group[0].settlement == Delete(str(JobState.SENT))
    assert isinstance(group[1].settlement, Park)
    assert [ids for ids, _, _ in store.throttled] == [["j-1"]]
    assert quota.asked == []


async def test_refused_mails_are_parked_only_when_none_is_finished() -> None:
    # Parking marks a job waiting (or ends it dead when it can never fit): not one
    # sent already. The refused are weighed again, without it, at the next receive.
    _, store, quota, groups, sending, _ = setup()
    store.states["j-1"] = str(JobState.SENT)
    group = [mail("acme", n) for n in range(3)]
    quota.grant = Grant(granted=1, retry_after=30.0, blocked_by="tenant", at_ms=store.clock_ms)
    await groups.handle("acme", group)
    assert sending.granted == [group[0]]
    assert store.state_reads == [["j-1", "j-2"]]
    assert [m.settlement for m in group[1:]] == [Delete(str(JobState.SENT)), HAND_BACK]
    assert store.throttled == []


async def test_a_paused_tenants_head_is_parked_and_its_backlog_handed_back() -> None:
    ctx, store, quota, groups, sending, _ = setup()
    ctx.limits = _Paused(ctx.settings)
    group = [mail("acme", n) for n in range(3)]
    await groups.handle("acme", group)
    head = group[0].settlement
    assert isinstance(head, Park)
    assert (head.tenant, head.reason) == ("acme", "paused")
    jitter = ctx.settings.sender.max_jitter_seconds
    assert PAUSED_RECHECK_SECONDS <= head.seconds <= PAUSED_RECHECK_SECONDS + jitter
    assert [m.settlement for m in group[1:]] == [HAND_BACK, HAND_BACK]
    assert quota.asked == [] and sending.granted == []
    assert store.throttled == [(["j-0"], "paused", store.clock_ms + int(head.seconds * 1000))]


async def test_a_tenant_over_its_quota_for_a_moment_is_retried_here_whole() -> None:
    _, store, quota, groups, sending, _ = setup()
    group = [mail("acme", n) for n in range(3)]
    quota.grant = Grant(granted=1, retry_after=0.4, blocked_by="tenant", at_ms=store.clock_ms)
    before = time.monotonic()
    await groups.handle("acme", group)
    assert sending.granted == [group[0]]
    retries = [m.settlement for m in group[1:]]
    assert all(isinstance(r, TimedRetry) for r in retries)
    for r in retries:
        assert isinstance(r, TimedRetry)
        # Its own quota: no jitter, due the moment the quota frees.
        assert before + 0.4 <= r.at <= time.monotonic() + 0.4
        assert (r.margin, r.tenant) == (PRECISE_SAFETY_NET, "acme")


async def test_a_long_global_wait_parks_one_and_closes_the_gate() -> None:
    _, store, quota, groups, sending, gate = setup()
    group = [mail("acme", n) for n in range(3)]
    quota.grant = Grant(granted=0, retry_after=30.0, blocked_by="global", at_ms=store.clock_ms)
    await groups.handle("acme", group)
    head = group[0].settlement
    assert isinstance(head, Park) and head.reason == "global_quota" and head.seconds >= 30.0
    assert [m.settlement for m in group[1:]] == [HAND_BACK, HAND_BACK]
    assert gate.holding()
    assert sending.granted == []


async def test_a_mail_that_can_never_fit_ends_dead_and_the_next_waits() -> None:
    _, store, quota, groups, _, _ = setup()
    group = [mail("acme", 0, recipients=50), mail("acme", 1), mail("acme", 2)]
    quota.grant = Grant(granted=0, retry_after=NEVER, blocked_by="tenant", at_ms=store.clock_ms)
    await groups.handle("acme", group)
    assert group[0].settlement == Delete("dead")
    assert store.finished == {"j-0": str(JobState.DEAD)}
    # The rest ask again in a second (as a quota wait of one, timed here).
    assert isinstance(group[1].settlement, TimedRetry) and isinstance(group[2].settlement, TimedRetry)


@pytest.mark.parametrize("retry_after", [0.05, 0.3, 1.5])
async def test_a_tenants_timed_retry_is_due_when_its_quota_frees(retry_after: float) -> None:
    """Jitter spreads many tenants waking for one global quota; a tenant waiting for its
    own quota has no one to spread from, and a late retry only leaves its quota unused.
    (Moved from tests/daemon/test_sender_retry.py, where the store was Redis.)"""
    _, store, _, groups, _, _ = setup()
    for n in range(10):
        msg = mail("t", n)
        # Parked one at a time: each draw of a jitter would show in its own retry_at.
        before = time.monotonic()
        await groups.park("t", [msg], retry_after, "tenant", await store.now_ms())
        assert msg.retry_at is not None
        assert before + retry_after <= msg.retry_at <= time.monotonic() + retry_after
