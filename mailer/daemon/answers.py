"""What SES's answers mean for a group's mails, their tenant and the whole sender.

A group's answers are taken in one order (:meth:`Answers.conclude`): recorded
first, in one pipeline (a sent mail's job finished, its quota units moved to the
answer, what reputation and deliverability keep of it), because a mail SES has,
left unrecorded, would be sent again when its message comes back; then each
answer obeyed, becoming the mail's settlement (fairpost.mailer.daemon.settlement;
the classes are in fairpost.mailer.daemon.ses): a sent mail is deleted;
throttling holds the whole sender for a growing back-off, or, when SES says the
day's quota is spent, until the day can free (the account read again); a refusal
of the tenant's own set-up holds that tenant alone (``ses_<code>``,
fairpost.mailer.daemon.holds), rechecked one mail at a time; an account pause
holds every tenant; a permanent refusal is a dead letter; a transient failure is
an attempt, retried with back-off. Last, what the answers mean together.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from typing import Any

from redis.asyncio.client import Pipeline

from fairpost.dispatcher.backoff import until_landed
from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.aws import SesClient
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.counting import Counting, Stamp
from fairpost.mailer.daemon.deliverability import Counts
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.feedback import Feedback
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.inbox import MAX_VISIBILITY, Received
from fairpost.mailer.daemon.parking import Parking
from fairpost.mailer.daemon.ses_account import daily_quota_wait, is_daily_quota_exceeded
from fairpost.mailer.daemon.settlement import HAND_BACK, Backoff, Delete, Park, Settlement, attempt_backoff
from fairpost.mailer.errors import SesAccountError
from fairpost.mailer.quota.holds import SES_TENANT_DISABLED
from fairpost.mailer.sdk.envelope import Envelope
from fairpost.mailer.sdk.outcomes import feed

log = logging.getLogger("fairpost.sender")

_THROTTLE_BACKOFF_MIN = 0.5
_THROTTLE_BACKOFF_MAX = 30.0

Answered = list[tuple[Received, ses.SendResult, Stamp]]


class Answers:
    def __init__(
        self,
        ctx: SenderContext,
        ses_client: SesClient,
        gate: Gate,
        endings: Endings,
        counting: Counting,
        parking: Parking,
    ) -> None:
        self.ctx = ctx
        self.ses = ses_client
        self.gate = gate
        self.endings = endings
        self.counting = counting
        self._throttle_backoff = _THROTTLE_BACKOFF_MIN
        self._daily_lock = asyncio.Lock()
        self._daily_until = 0.0
        self.parking = parking

    async def conclude(self, tenant: str, answered: Answered, at_ms: int) -> None:
        """A group's SES answers, in the order they must land: recorded first (a mail
        SES has, left unrecorded, would be sent again when its message comes back),
        then each obeyed (its settlement), then what they mean together. Raises the
        first error of an answer's obeying once every other answer is taken."""
        await self._record(tenant, answered)
        errors: list[Exception] = []
        for msg, result, stamp in answered:
            msg.in_call = False  # its answer is recorded: it may be decided again
            try:
                msg.decide(await self.obey(tenant, msg, stamp, result))
            except Exception as exc:  # the round's failure path settles this mail
                errors.append(exc)
        await self.after_group(tenant, answered, at_ms)
        if errors:
            raise errors[0]

    async def _record(self, tenant: str, answered: Answered) -> None:
        """Record a group's answers in one round trip (one pipeline): the quota units
        of every mail SES may have move to the answer (fairpost.mailer.daemon.counting); then
        each sent job is finished and its sending marker released. One pipeline, not
        three round trips per mail: Redis round trips are the largest cost the daemon
        has beside the calls it cannot avoid (bench/profile.py)."""
        sent = [
            (m.envelope.job_id, r.message_id or "")
            for m, r, _ in answered
            if r.verdict is ses.Verdict.SENT and m.envelope
        ]
        # Each sent job's mail.sent event goes into the feed with its record (finish.lua).
        events = {
            m.envelope.job_id: _sent_event(m.envelope, r.message_id)
            for m, r, _ in answered
            if r.verdict is ses.Verdict.SENT and m.envelope
        }
        if not sent and not any(r.verdict is ses.Verdict.TRANSIENT for _, r, _ in answered):
            return
        ctx = self.ctx
        accepted = [m.envelope for m, r, _ in answered if r.verdict is ses.Verdict.SENT and m.envelope]
        # Their recipients by mailbox provider, for the deliverability rollup (one script
        # call in the pipeline below; the MX lookups started when the group was read).
        rolled = await ctx.feedback.sent_counts(accepted) if ctx.feedback is not None else {}

        # SES has these mails: their record must be written (and be on the replicas
        # FAIRPOST_REDIS_MIN_REPLICAS asks for), or their messages would come back
        # unrecorded after a failover and be sent again. So a failing Redis is ridden
        # out here, for as long as the daemon rides out an outage. A retry writes again:
        # finishing a sent job changes nothing, and moving units twice counts them twice
        # at the answer (the safe side).
        feedback = ctx.feedback
        recipients = sum(e.mail.recipients for e in accepted)

        async def write() -> Any:
            async with ctx.store.pipeline() as pipe:
                await self.counting.move_to_answers(tenant, answered, pipe)
                # Before the record of the send: its send number goes on the record
                # (mailer/quota/send_seq.lua), whose line in the history keeps it.
                if feedback is not None:
                    await self._queue_feedback(pipe, feedback, tenant, answered, rolled)
                await ctx.mail.record_sent(sent, keep_seconds=ctx.finished_ttl, pipeline=pipe, entries=events)
                # Last, after the records: the reputation count, whose error is not theirs.
                counted = len(pipe)
                if feedback is None or not await feedback.queue_count_sent(pipe, tenant, recipients):
                    counted = -1
                execute = functools.partial(ctx.store.execute_durably, lenient=counted)
                replies = await ctx.scripts.execute(pipe, execute)
                return replies[counted] if counted >= 0 else None

        what = f"recording {len(sent)} sent mails"
        reputation = await until_landed(what, write, ctx.settings.max_outage_seconds, first=0.2, most=2.0)
        if feedback is not None:
            feedback.counted(tenant, rolled)
            if recipients > 0:
                await feedback.counted_sent(tenant, recipients, reputation)

    @staticmethod
    async def _queue_feedback(
        pipe: Pipeline,
        feedback: Feedback,
        tenant: str,
        answered: Answered,
        rolled: Counts,
    ) -> None:
        """Queue what reputation and deliverability keep of the sent mails (a retry of
        the pipeline queues it again: the rollup then counts them twice, the safe side)."""
        recipients = 0
        sent: list[tuple[str, str | None, int]] = []
        for msg, result, _ in answered:
            if result.verdict is ses.Verdict.SENT and msg.envelope is not None:
                env = msg.envelope
                recipients += env.mail.recipients
                sent.append((env.job_id, result.message_id, env.mail.recipients))
        await feedback.index_sent(pipe, tenant, sent)
        if recipients:
            await feedback.queue_sent(pipe, tenant, rolled, recipients)

    async def obey(self, tenant: str, msg: Received, stamp: Stamp, result: ses.SendResult) -> Settlement:
        """Do what SES's answer means for this mail (the table in fairpost.mailer.daemon.ses),
        and say what becomes of its message."""
        ctx = self.ctx
        env = msg.envelope
        assert env is not None
        extra = {"job_id": env.job_id, "tenant": tenant}
        if result.verdict is ses.Verdict.SENT:
            # Recorded already, with the rest of its group (_record).
            self._throttle_backoff = _THROTTLE_BACKOFF_MIN
            ctx.stats.sent += 1
            ctx.metrics.sent(tenant, env.created_ms)
            return Delete("sent")
        if result.verdict is not ses.Verdict.TRANSIENT:
            # SES refused it outright: the quota units go back. After a 5xx or a
            # network error SES may have the mail, so its units stay counted.
            await self.counting.refund(tenant, msg, stamp.at_ms)
        ctx.stats.by_reason[result.verdict.value] = ctx.stats.by_reason.get(result.verdict.value, 0) + 1
        if result.verdict is ses.Verdict.THROTTLED:
            return await self._throttled(tenant, env.job_id, result, extra)
        if result.verdict is ses.Verdict.TENANT:
            # This tenant's own SES set-up: it alone waits, nothing is counted against the mail.
            reason, until_ms, wait = await ctx.holds.hold_for_ses(tenant, result.reason)
            ctx.metrics.throttled(tenant, reason)
            await ctx.mail.mark_waiting([env.job_id], reason, until_ms)
            log.warning(
                "SES refuses this tenant's mail (%s); tenant held %.1fs", result.error, wait, extra=extra
            )
            # Parked, not backed off: a lift of the hold (a resume) brings it back at once.
            return Park(wait, tenant, reason)
        if result.verdict is ses.Verdict.PAUSED:
            log.error(
                "SES refuses to send (%s); sender paused %.0fs",
                result.error,
                ctx.settings.sender.pause_seconds,
                extra=extra,
            )
            return Backoff(ctx.settings.sender.pause_seconds, "ses_paused")
        if result.verdict is ses.Verdict.PERMANENT:
            return await self.endings.dead(msg, result.error or "rejected by SES", "rejected")
        attempts = await ctx.store.count_attempt(env.job_id, result.error or "")
        if attempts >= ctx.settings.sender.max_attempts:
            return await self.endings.dead(
                msg, f"gave up after {attempts} attempts: {result.error}", "attempts"
            )
        ctx.stats.retried += 1
        ctx.metrics.retried(tenant)
        log.warning("SES send failed (attempt %d): %s", attempts, result.error, extra=extra)
        return attempt_backoff(attempts, ctx.settings.sender, "ses_transient")

    async def _throttled(
        self, tenant: str, job_id: str, result: ses.SendResult, extra: dict[str, str]
    ) -> Settlement:
        """SES throttled the account: the whole sender waits, doubling, or until the
        day can free when SES says the day's quota is spent."""
        ctx = self.ctx
        ctx.stats.throttled_by_ses += 1
        ctx.metrics.throttled(tenant, "ses")
        daily = await self._daily_hold() if is_daily_quota_exceeded(result.error) else None
        if daily is None:
            delay = self._throttle_backoff
            self._throttle_backoff = min(self._throttle_backoff * 2, _THROTTLE_BACKOFF_MAX)
        else:
            delay = daily
        self.gate.hold(delay)
        jitter = random.uniform(0, ctx.settings.sender.max_jitter_seconds)
        await ctx.mail.count_throttled([job_id], "ses", await ctx.store.now_ms() + int(delay * 1000))
        log.warning("SES throttled; sender backs off %.1fs", delay, extra=extra)
        return Backoff(min(delay + jitter, MAX_VISIBILITY), "ses_throttled")

    async def _daily_hold(self) -> float | None:
        """SES says the account's day is spent: the seconds to hold sending, from the
        account read again (fairpost.mailer.daemon.ses_account.daily_quota_wait); None when SES
        has room again or the account cannot be read (then a throttle's back-off).
        The mails of one batch refused together read the account once."""
        async with self._daily_lock:
            left = self._daily_until - time.monotonic()
            if left > 0:
                return left
            ctx = self.ctx
            try:
                wait = await daily_quota_wait(
                    self.ses,
                    ctx.quota,
                    ctx.limits.global_limits(),
                    recheck_seconds=ctx.settings.ses_account_refresh,
                )
            except SesAccountError as exc:
                log.warning("SES's daily quota is spent and the account cannot be read: %s", exc)
                return None
            if wait <= 0:
                return None
            self._daily_until = time.monotonic() + wait
            log.error("SES's daily quota is spent: sending holds %.0fs", wait)
            return wait

    async def after_group(self, tenant: str, answered: Answered, at_ms: int) -> None:
        """What a group's answers together mean, once they are recorded."""
        paused = [m for m, r, _ in answered if r.verdict is ses.Verdict.PAUSED]
        # An SES tenant SES paused is held here already (ses_SendingPausedException);
        # when SES has disabled it (feedback), that is what the tenant waits for.
        ses_tenant_paused = [
            m
            for m, r, _ in answered
            if r.verdict is ses.Verdict.TENANT and r.code == "SendingPausedException"
        ]
        feedback = self.ctx.feedback
        if feedback is not None and any(r.verdict is not ses.Verdict.SENT for _, r, _ in answered):
            feedback.send_failed(tenant)
        if ses_tenant_paused and feedback is not None and await feedback.disabled_now(tenant):
            await self.park_disabled(tenant, ses_tenant_paused, at_ms)
        if paused and feedback is not None and await feedback.disabled_now(tenant):
            # SES disabled this tenant's SES tenant, not the account: it waits alone.
            await self.park_disabled(tenant, paused, at_ms)
        elif paused:
            self.gate.hold(self.ctx.settings.sender.pause_seconds)
        faulted = [m for m, r, _ in answered if r.verdict is ses.Verdict.TENANT]
        for behind in faulted[1:]:
            # One message waits in flight; FIFO order keeps the rest behind it.
            behind.overrule(HAND_BACK)
        if any(r.verdict is ses.Verdict.SENT for _, r, _ in answered):
            await self.ctx.holds.sent(tenant)

    async def park_disabled(self, tenant: str, paused: list[Received], at_ms: int) -> None:
        """SES disabled the tenant's SES tenant: its refused mails wait (recheck, then
        resume), whatever their own answers decided."""
        assert self.ctx.feedback is not None
        # The park says why in the job's status (waiting_for), as every park does.
        hold = self.ctx.holds.until_lifted(SES_TENANT_DISABLED)
        await self.parking.park(tenant, paused, hold.recheck, hold.reason, at_ms, overrule=True)


def _sent_event(env: Envelope, message_id: str | None) -> dict[str, str]:
    """The mail.sent event's own fields (docs/outcomes.md): the recipients SES took."""
    mail = env.mail
    return feed.entry(
        feed.SENT, {"ses_message_id": message_id, "recipients": [*mail.to, *mail.cc, *mail.bcc]}
    )
