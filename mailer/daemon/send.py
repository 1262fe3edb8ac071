"""Sending a tenant's granted mail: claim, content, SES, and what SES said.

For the mails of one group the quota engine granted: take each job's sending
marker (two receivers of one message must not both send it), load the
content of claim-checked mail, call SES for each (bounded by
``sender.concurrency``), keep each counted until SES has answered
(fairpost.mailer.daemon.counting), then hand the group's answers to
fairpost.mailer.daemon.answers, which records them before anything else can
fail and decides what each means.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from botocore.exceptions import BotoCoreError, ClientError
from redis.exceptions import RedisError

from fairpost.config.sections import TenantSettings
from fairpost.dispatcher.backoff import wait_or_stop
from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.answers import Answers
from fairpost.mailer.daemon.aws import SesClient
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.counting import Counting, Stamp, may_have_it
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.inbox import Inbox, Received
from fairpost.mailer.daemon.parking import Parking
from fairpost.mailer.daemon.settlement import Backoff, Delete

log = logging.getLogger("fairpost.sender")

_CLAIMED_ELSEWHERE_WAIT = 5.0
"""Seconds a message another sender is sending stays hidden before it is looked at again."""


class Sending:
    def __init__(
        self,
        ctx: SenderContext,
        ses_client: SesClient,
        gate: Gate,
        inbox: Inbox,
        endings: Endings,
        counting: Counting,
        parking: Parking,
    ) -> None:
        self.ctx = ctx
        self.inbox = inbox
        self.ses = ses_client
        self.gate = gate
        self.endings = endings
        self.counting = counting
        self._slots = asyncio.Semaphore(ctx.settings.sender.concurrency)
        self.account = ses.AccountCheck(ses_client)
        self.answers = Answers(ctx, ses_client, gate, endings, counting, parking)

    async def send_granted(
        self, tenant: str, granted: list[Received], at_ms: int, asked: float | None = None
    ) -> None:
        """Send the mails a grant at ``at_ms`` covers; each is decided (its settlement)
        once its answer is known. Raises the first error after every answer is recorded.
        ``asked``: the grant's ``asked_mono`` (fairpost.mailer.daemon.counting.Stamp.since)."""
        granted = await self._claim(tenant, granted, at_ms)
        # Kept hidden from a third of the messages' visibility on, counted from their
        # receive: the decision and the acquire before the send may have used much of
        # it. Until then a timer, and a task only for a group whose sends last that
        # long (nearly none do).
        keepers: list[asyncio.Task[None]] = []
        sent = asyncio.Event()
        timer = None
        if granted:
            lifetime = self.ctx.settings.sender.visibility_timeout
            first = min(m.hidden_until for m in granted) - lifetime * 2 / 3 - time.monotonic()
            timer = asyncio.get_running_loop().call_later(
                max(0.0, first),
                lambda: keepers.append(
                    asyncio.create_task(self._keep_hidden(granted, sent), name="sender-keep-hidden")
                ),
            )
        try:
            await self._send_claimed(tenant, granted, at_ms, asked)
        finally:
            sent.set()
            if timer is not None:
                timer.cancel()
            for keeper in keepers:
                keeper.cancel()
            if keepers:
                await asyncio.gather(*keepers, return_exceptions=True)

    async def _keep_hidden(self, messages: list[Received], sent: asyncio.Event) -> None:
        """While a group is being sent and recorded, its messages stay hidden in SQS and
        their sending markers held: a send may outlive the receive's visibility (a slow
        SES call, a wait for an SES slot, a Redis blip while recording), and a message
        that came back then would be sent again by the next receiver. Started a third
        of a lifetime into their visibility, and again every third of a lifetime, until
        ``sent`` is set. The keeper is cancelled too, but it does not rely on that: a
        client library may swallow a cancellation that lands mid-call (seen with
        redis-py's asyncio client, redis/redis-py#2028), and the send's end would then
        wait out a whole third of a lifetime."""
        lifetime = self.ctx.settings.sender.visibility_timeout
        ids = [m.envelope.job_id for m in messages if m.envelope]
        while not sent.is_set():
            try:
                await self.inbox.extend(messages, lifetime)
                await self.ctx.mail.hold_sending(ids, lifetime * 1000)
            except (RedisError, BotoCoreError, ClientError, OSError) as exc:
                # Tried again a third of a lifetime later, before anything lapses.
                log.warning("could not keep a send's messages hidden: %s", exc)
            await wait_or_stop(sent, lifetime / 3)

    async def _send_claimed(
        self, tenant: str, granted: list[Received], at_ms: int, asked: float | None
    ) -> None:
        granted = await self._load_content(tenant, granted, at_ms)
        stream = self.counting.stream(tenant, granted[0]) if granted else None
        stamps = [Stamp(at_ms, time.monotonic(), stream, since=asked) for _ in granted]
        # How often a mail not yet answered is kept counted, and the tenant's settings
        # for its SES requests: the same for the whole group, looked up once.
        every = self.counting.every(tenant)
        own = self.ctx.settings.tenant(tenant)
        sends = [
            asyncio.ensure_future(self._send_one(tenant, own, m, stamp, every))
            for m, stamp in zip(granted, stamps, strict=True)
        ]
        # Every answer, or the error its send ended with: one future for the group, not
        # a wait on each send and then a gather of them all (#41: a callback a mail less).
        answers = asyncio.gather(*sends, return_exceptions=True)
        try:
            await self.counting.wait_for_answers(tenant, granted, stamps, sends, every, answers)
        except asyncio.CancelledError:
            for send in sends:
                send.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
            raise
        outcomes = answers.result()
        # Record every answer SES gave before raising any error: a sent mail left
        # unrecorded would be sent again when its message comes back.
        answered = [
            (m, r, stamp)
            for m, r, stamp in zip(granted, outcomes, stamps, strict=True)
            if isinstance(r, ses.SendResult)
        ]
        await self.answers.conclude(tenant, answered, at_ms)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _claim(self, tenant: str, granted: list[Received], at_ms: int) -> list[Received]:
        """Take each job's sending marker; what another sender holds, or what ended
        meanwhile, is not sent here (and its quota units go back)."""
        if not granted:
            return granted
        ctx = self.ctx
        ids = [m.envelope.job_id for m in granted if m.envelope]
        # Each receive claims as itself: tried again after a failure (an answer lost
        # on its way back, say), it takes back the marker it holds already.
        claimants = [m.claimant for m in granted if m.envelope]
        codes = await ctx.mail.claim_sending(
            ids, ctx.settings.sender.visibility_timeout * 1000, claimants=claimants
        )
        claimed = []
        for msg, code in zip(granted, codes, strict=True):
            if code == 1:
                claimed.append(msg)
                continue
            assert msg.envelope is not None
            await self.counting.refund(tenant, msg, at_ms)
            if code == 2:
                msg.decide(Delete("finished"))
            elif code == 3:
                # No record (a purged dead letter, an expired one): a cancelled or
                # finished job's message would otherwise go out. Drop it.
                msg.decide(Delete("no record"))
                ctx.stats.dropped += 1
                ctx.metrics.dropped(tenant, "no_record")
                log.warning(
                    "message dropped unsent: its job record is gone",
                    extra={"job_id": msg.envelope.job_id, "tenant": tenant},
                )
            else:
                # Back soon: by then the other sender has recorded the outcome.
                msg.decide(Backoff(_CLAIMED_ELSEWHERE_WAIT, "claimed elsewhere"))
        return claimed

    async def _load_content(self, tenant: str, granted: list[Received], at_ms: int) -> list[Received]:
        """Claim checks (envelope version 2): load each mail's MIME message from Redis,
        only once its quota is granted. A mail whose content is gone (purged, or a key
        that is not its own) is dead-lettered and its quota units are refunded."""
        stored = [m for m in granted if m.envelope is not None and m.envelope.content_key]
        if not stored:
            return granted
        ctx = self.ctx
        contents = await ctx.store.contents([m.envelope.job_id for m in stored if m.envelope])
        lost: set[str] = set()
        for msg, content in zip(stored, contents, strict=True):
            env = msg.envelope
            assert env is not None
            if content is None or env.content_key != ctx.store.keys.content(env.job_id):
                lost.add(msg.receipt)
                await self.counting.refund(tenant, msg, at_ms)
                msg.decide(
                    await self.endings.dead(
                        msg, "the mail's content (a claim check) is gone from Redis", "poison"
                    )
                )
            else:
                mail = dataclasses.replace(env.mail, raw=bytes(content))
                msg.envelope = dataclasses.replace(env, mail=mail)
        return [m for m in granted if m.receipt not in lost]

    async def _send_one(
        self, tenant: str, own: TenantSettings, msg: Received, stamp: Stamp, every: float
    ) -> ses.SendResult:
        assert msg.envelope is not None
        job_id = msg.envelope.job_id
        try:
            result = await self._call(tenant, own, msg, stamp, every)
        except asyncio.CancelledError:
            # Shutdown mid-call: SES may have the mail. Keep the marker (it ends
            # with the message's visibility), so no other replica sends it meanwhile.
            if not msg.in_call:
                await self.ctx.mail.release_sending(job_id)
            raise
        except BaseException:
            await self.ctx.mail.release_sending(job_id)
            raise
        if result.verdict is not ses.Verdict.SENT:
            # A sent job's marker goes with its record (Answers.conclude).
            await self.ctx.mail.release_sending(job_id)
        return result

    async def _call(
        self, tenant: str, own: TenantSettings, msg: Received, stamp: Stamp, every: float
    ) -> ses.SendResult:
        """Wait for an SES slot and call SES (``own``: the tenant's settings), keeping the
        mail counted meanwhile (once ``every`` seconds)."""
        env = msg.envelope
        assert env is not None
        cost = env.mail.recipients
        async with self._slots:
            await self.counting.keep(tenant, cost, stamp, every)
            started = time.monotonic()
            msg.in_call = True
            result = await self.counting.keep_during(
                ses.send(self.ses, env, own, self.account),
                tenant,
                cost,
                stamp,
                every,
            )
            # SES has it, or may have: it stays in the call until its answer is recorded.
            msg.in_call = may_have_it(result.verdict)
            self.ctx.metrics.ses_call(result.verdict.value, time.monotonic() - started)
        return result
