"""One tenant's group of a received batch: what is sent now, and what waits.

A batch's messages of one tenant (one FIFO group, in order) are weighed
together: mail already sent or dead is deleted, a held tenant's mail is
parked (fairpost.mailer.daemon.holds), and the rest asks the quota engine in
one atomic call for all its recipients. The granted head goes to
:class:`fairpost.mailer.daemon.send.Sending`; the refused tail is parked, its
visibility extended to the moment the quota frees, which in a FIFO queue
pauses that tenant alone. Each message's fate is decided here as a settlement
(fairpost.mailer.daemon.settlement), which the inbox applies.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.counting import Counting
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.daemon.mail_jobs import FINAL_STATES
from fairpost.mailer.daemon.parking import Parking
from fairpost.mailer.daemon.provider_holds import TAKEN_BACK_MIN_SECONDS, ProviderHolds
from fairpost.mailer.daemon.send import Sending
from fairpost.mailer.daemon.settlement import HAND_BACK, Backoff, Delete
from fairpost.mailer.daemon.unsubscribed import Unsubscribed
from fairpost.mailer.quota.engine import Grant, never_fits_reason
from fairpost.mailer.quota.provider_guard import ProviderHold
from fairpost.mailer.sdk.envelope import Envelope
from fairpost.mailer.sdk.streams import TRANSACTIONAL

log = logging.getLogger("fairpost.sender")


class GroupDecision:
    def __init__(
        self,
        ctx: SenderContext,
        gate: Gate,
        counting: Counting,
        endings: Endings,
        sending: Sending,
        parking: Parking,
    ) -> None:
        self.ctx = ctx
        self.gate = gate
        self.counting = counting
        self.endings = endings
        self.sending = sending
        self.park = parking.park
        self.unsubscribed = Unsubscribed(ctx.store, ctx.metrics, ctx.finished_ttl)

    async def handle(self, tenant: str, group: list[Received]) -> None:
        ctx = self.ctx
        envelopes = [m.envelope for m in group if m.envelope is not None]
        hold = ctx.holds.of(tenant)
        held_for = await ctx.provider_holds.tenant_holds(tenant) if ctx.provider_holds is not None else {}
        # The jobs' states are read only where a mail may end here other than by its
        # send: held, or suppressed. Mail sent or finished already is otherwise
        # deleted by its claim (send_claim.lua), its units given back (send.py).
        states, suppressed, unsubscribed = await self._look_up(
            tenant, envelopes, states=hold is not None or bool(held_for)
        )
        if states is None and (suppressed or any(v is not None for v in unsubscribed.values())):
            states = await ctx.store.job_states([e.job_id for e in envelopes])
        todo = _not_finished(group, states or {})
        todo = _suppressed(todo, await self.unsubscribed.screen(tenant, todo, unsubscribed))
        if not todo:
            return
        if hold is not None:
            # Held (paused, its SES tenant disabled, its own SES fault): its mail waits,
            # alone, uncounted, until the hold's recheck.
            await self.park(tenant, todo, hold.recheck, hold.reason, await ctx.store.now_ms())
            return
        if held_for:
            assert ctx.provider_holds is not None and states is not None
            todo = await self._provider_held(tenant, todo, ctx.provider_holds, held_for, states)
            if not todo:
                return
        if ctx.feedback is not None:
            todo = _suppressed(todo, await ctx.feedback.screen(tenant, todo, suppressed))
            if not todo:
                return
        if ctx.holds.probing(tenant):
            # The hold ended: one mail asks SES whether the fault is gone; the rest
            # wait behind it in their FIFO group.
            for behind in todo[1:]:
                behind.decide(HAND_BACK)
            todo = todo[:1]
        grant = await self.counting.acquire(tenant, todo)
        granted, refused = todo[: grant.granted], todo[grant.granted :]
        if refused and states is None and not await self._refused_to_park(refused):
            refused = []
        if not refused:
            await self.sending.send_granted(tenant, granted, grant.at_ms, grant.asked_mono)
            return
        await self._send_and_park(tenant, granted, refused, grant)

    async def _send_and_park(
        self, tenant: str, granted: list[Received], refused: list[Received], grant: Grant
    ) -> None:
        ctx = self.ctx
        first = refused[0].envelope
        never = never_fits_reason(grant, first.mail.recipients) if first and grant.retry_after < 0 else None
        label = ctx.refusal_reason(tenant, grant)
        # The granted are on their way to SES while the refused are parked: their
        # quota units count from the grant on, and waiting for the park's Redis
        # calls first left them counted, unsent, that much longer (docs/design.md,
        # "Where a binding global quota's units go").
        outcomes = await asyncio.gather(
            self.sending.send_granted(tenant, granted, grant.at_ms, grant.asked_mono),
            self.park(
                tenant, refused, grant.retry_after, grant.blocked_by, grant.at_ms, never=never, label=label
            ),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _refused_to_park(self, refused: list[Received]) -> bool:
        """Whether the refused mails, whose states were not read, are parked: none is
        finished (a redelivery of mail sent already, which parking would mark waiting,
        or end dead if it can never fit). Else the finished are deleted and the rest
        handed back, for the next receive to weigh them again: the quota refused them
        as the group it asked for, and only a new ask says how they fare without."""
        states = await self.ctx.store.job_states([m.envelope.job_id for m in refused if m.envelope])
        if not any(state in FINAL_STATES for state in states.values()):
            return True
        for msg in _not_finished(refused, states):
            msg.decide(HAND_BACK)
        return False

    async def _provider_held(
        self,
        tenant: str,
        todo: list[Received],
        holds: ProviderHolds,
        held: dict[str, ProviderHold],
        states: dict[str, str],
    ) -> list[Received]:
        """The mails not held for their recipients' provider (``held``: the tenant's
        holds). Those held are taken back out of SQS (scheduled again in Redis, then
        their messages deleted): waiting in SQS they would block the tenant's group,
        its mail to every other provider too."""
        kept: list[Received] = []
        taken: dict[str, tuple[ProviderHold, list[Received]]] = {}
        for msg in todo:
            assert msg.envelope is not None
            mail = msg.envelope.mail
            hold = await holds.blocking(held, mail.to + mail.cc + mail.bcc)
            if hold is None:
                kept.append(msg)
            else:
                taken.setdefault(hold.provider, (hold, []))[1].append(msg)
        wait = max(holds.recheck_seconds, TAKEN_BACK_MIN_SECONDS)
        for hold, msgs in taken.values():
            ids = [m.envelope.job_id for m in msgs if m.envelope is not None]
            event = holds.event(hold)
            codes = await self.ctx.store.defer(
                ids, int(wait * 1000), hold.waiting_for, entries=dict.fromkeys(ids, event)
            )
            for msg, job_id, code in zip(msgs, ids, codes, strict=True):
                if code == -1:
                    kept.append(msg)  # no record: ended below as any such message is
                elif code > 0 or states.get(job_id) == "scheduled":
                    # In Redis now (or already: a copy of a mail taken back before).
                    msg.decide(Delete(hold.waiting_for))
                    if msg.trace is not None:
                        msg.trace.state = hold.waiting_for
                else:
                    # A sender has it, or its hand-off is not recorded yet: looked at again.
                    msg.decide(Backoff(holds.recheck_seconds, hold.waiting_for))
            self.ctx.metrics.throttled(tenant, hold.waiting_for, len(msgs))
            log.info(
                "%d mails held for %s taken back out of SQS",
                len(msgs),
                hold.provider,
                extra={"tenant": tenant},
            )
        return kept

    async def _look_up(
        self, tenant: str, envelopes: list[Envelope], *, states: bool
    ) -> tuple[dict[str, str] | None, set[str] | None, dict[str, Any]]:
        """With ``states``, each job's state (a job without a record left out), else
        None; with reputation on, which of the mails' recipients are on the tenant's
        suppression list (else None); and the notifications' unsubscribes
        (fairpost.mailer.daemon.unsubscribed): one round trip for them all, not one
        each, and none when there is nothing to read."""
        ctx = self.ctx
        feedback = ctx.feedback
        ids = [e.job_id for e in envelopes]
        if feedback is None and all(e.mail.stream == TRANSACTIONAL for e in envelopes):
            return (await ctx.store.job_states(ids) if states else None), None, {}
        async with ctx.store.pipeline() as pipe:
            asked = ctx.store.ask_job_states(pipe, ids) if states else None
            suppressed = None if feedback is None else feedback.ask_suppressed(pipe, tenant, envelopes)
            unsubscribed = self.unsubscribed.ask(pipe, tenant, envelopes)
            replies = iter(await pipe.execute())
        state = None if asked is None else asked.take(replies)
        listed = None if suppressed is None else suppressed.take(replies)
        return state, listed, unsubscribed.take(replies)


def _not_finished(group: list[Received], states: dict[str, str]) -> list[Received]:
    """The group's mails still to send; the rest are deleted: sent already (a
    redelivery after a crash), cancelled, dead or suppressed, never again; or twice
    in one batch (a replayed job's old message), where once is enough."""
    todo: list[Received] = []
    seen: set[str] = set()
    for msg in group:
        assert msg.envelope is not None
        state = states.get(msg.envelope.job_id)
        if state in FINAL_STATES or msg.envelope.job_id in seen:
            msg.decide(Delete(str(state) if state else "duplicate"))
            if msg.trace is not None:
                msg.trace.state = str(state) if state else "duplicate"
        else:
            seen.add(msg.envelope.job_id)
            todo.append(msg)
    return todo


def _suppressed(todo: list[Received], kept: list[Received]) -> list[Received]:
    """``kept``; the rest of ``todo`` was finished ``suppressed`` (every recipient on the
    tenant's list, or unsubscribed), never to be sent: its messages are deleted."""
    staying = {id(m) for m in kept}
    for msg in todo:
        if id(msg) not in staying:
            msg.decide(Delete("suppressed"))
            if msg.trace is not None:
                msg.trace.state = "suppressed"
    return kept
