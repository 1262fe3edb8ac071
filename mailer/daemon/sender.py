"""The sender: SQS → quota → SES, pausing an over-quota tenant by visibility timeout.

For each received batch, messages are grouped by tenant (``MessageGroupId``)
in order. Each group asks the quota engine, in one atomic call, for the
recipients of its mails; what fits is sent and deleted, what does not gets
its visibility extended to the moment the quota frees, which in a FIFO
queue pauses that tenant alone. Nothing is put back on a queue and no worker
slot waits: SQS counts visibility in whole seconds, so a wait of under two
seconds is timed here as well (the message stays parked in SQS meanwhile, as
the safety net), and every other wait is SQS's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from redis.exceptions import RedisError

from config import Settings
from dispatcher.jobs import JobState
from dispatcher.keys import Keys
from dispatcher.scripts import lua_source
from dispatcher.store import JobStore
from mailer.daemon import ses
from mailer.daemon.aws import SesClient, SqsClient
from mailer.daemon.metrics import Metrics
from mailer.quota.engine import QuotaEngine
from mailer.quota.overrides import PAUSED_RECHECK_SECONDS, LimitSource, StaticLimits
from mailer.sdk.envelope import Envelope, PoisonMessage, decode

log = logging.getLogger("fairpost.sender")

MAX_VISIBILITY = 43_000
"""SQS allows 12 h (43,200 s) of visibility from a receive; keep a margin.
A longer wait (a daily quota) is served in steps: the message comes back,
is refused again, and is extended again."""

_THROTTLE_REASON = {
    "global": "global_quota",
    "tenant": "tenant_quota",
    "share": "global_share",
    "paused": "paused",
}
"""The quota engine's ``blocked_by`` (or an operator's pause) → the metrics label."""

PRECISE_WAIT_MAX = 2.0
"""Quota waits up to this long are timed by the sender itself, to the millisecond."""

PRECISE_JITTER = 0.01

PRECISE_SAFETY_NET = 10.0
"""Seconds added to the SQS visibility of a mail the sender times itself: if the
process dies, the mail comes back from SQS this much later."""

_CLAIMED_ELSEWHERE_WAIT = 5.0
"""Seconds a message another sender is sending stays hidden before it is looked at again."""

_LAST_POLL_WAIT = 1.5
"""Seconds a long poll in flight at shutdown gets to land before it is cut off."""

_ERROR_BACKOFF_MIN = 0.5
_ERROR_BACKOFF_MAX = 10.0

_THROTTLE_BACKOFF_MIN = 0.5
_THROTTLE_BACKOFF_MAX = 30.0


@dataclass
class Received:
    """One SQS message and what became of it."""

    message_id: str
    receipt: str
    group: str
    body: str
    envelope: Envelope | None = None
    delete: bool = False
    visibility: float | None = None
    retry_at: float | None = None
    """Set (monotonic) when the quota frees in under PRECISE_WAIT_MAX seconds: this
    process asks again then, instead of waiting for SQS's whole-second visibility."""
    in_call: bool = False
    """Its SES call started and its outcome is not known: on shutdown it is left to
    come back after its visibility timeout, its sending marker still held."""


@dataclass
class Stamp:
    """Where a granted mail's quota units are counted: the bucket of ``at_ms``
    (Redis time), put there at ``mono`` (this process's monotonic clock)."""

    at_ms: int
    mono: float


@dataclass
class SenderStats:
    received: int = 0
    sent: int = 0
    throttled_by_quota: int = 0
    throttled_by_ses: int = 0
    dead: int = 0
    dropped: int = 0
    retried: int = 0
    receives: int = 0
    empty_receives: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


class Sender:
    def __init__(
        self,
        *,
        sqs: SqsClient,
        ses_client: SesClient,
        queue_url: str,
        store: JobStore,
        quota: QuotaEngine,
        settings: Settings,
        limits: LimitSource | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.sqs = sqs
        self.ses = ses_client
        self.queue_url = queue_url
        self.store = store
        self.quota = quota
        self.settings = settings
        # Quota limits and pauses: the settings, or live overrides (mailer.quota.overrides).
        self.limits: LimitSource = limits or StaticLimits(settings)
        self.metrics = metrics or Metrics()
        self.keys: Keys = store.keys
        self.stats = SenderStats()
        self._ses_slots = asyncio.Semaphore(settings.sender.concurrency)
        self._send_claim = store.redis.register_script(lua_source("mailer.daemon", "send_claim"))
        self._timers: set[asyncio.Task[None]] = set()
        # Monotonic times before which no receive is made.
        self._hold_until = 0.0
        self._throttle_backoff = _THROTTLE_BACKOFF_MIN
        self._held: dict[str, Received] = {}
        # Messages parked for quota or a pause: tenant → receipt → monotonic time it returns.
        self._parked: dict[str, dict[str, float]] = {}
        self._regate = asyncio.Event()

    # -- the loop ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Receive and send until ``stop`` is set."""
        loops = [
            asyncio.create_task(self._receive_loop(stop), name=f"sender-receive-{i}")
            for i in range(self.settings.sender.receivers)
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _receive_loop(self, stop: asyncio.Event) -> None:
        errors, failing_since = 0, 0.0
        while not stop.is_set():
            try:
                if await self._wait_for_gate(stop):
                    continue
                messages = await self._receive(stop)
                if messages:
                    await self.process(messages)
                    if len(messages) < 10 and self.settings.sender.linger_seconds > 0:
                        # Mail is trickling in: let some gather, so that the next
                        # receive and its delete each carry more than one or two.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), timeout=self.settings.sender.linger_seconds)
                errors = 0
            except (RedisError, BotoCoreError, ClientError, OSError) as exc:
                # Redis or AWS is failing: what this batch held comes back after its
                # visibility timeout. Back off and go on, for a while: an outage that
                # lasts stops the daemon loudly, for its supervisor to restart it.
                errors += 1
                failing_since = failing_since if errors > 1 else time.monotonic()
                if time.monotonic() - failing_since > self.settings.max_outage_seconds:
                    raise
                delay = min(_ERROR_BACKOFF_MIN * 2 ** (errors - 1), _ERROR_BACKOFF_MAX)
                log.error("sender batch failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                self.metrics.receive_failed()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _wait_for_gate(self, stop: asyncio.Event) -> bool:
        """Wait while the sender is held (global quota spent, SES throttling or paused).

        Returns True if it waited, so the caller looks at the world again.
        """
        wait = self._hold_until - time.monotonic()
        global_wait = await self.quota.global_retry_after(self.limits.global_limits())
        wait = max(wait, global_wait)
        if wait <= 0:
            return False
        # Receiving now would only park every message it got: wait it out
        # (or until the global limits change: see regate).
        self._regate.clear()
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._regate.wait())]
        try:
            await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        return True

    def regate(self) -> None:
        """The global limits changed: look at the gate again now, not when the old limits freed it."""
        self._hold_until = 0.0
        self._regate.set()

    async def _receive(self, stop: asyncio.Event) -> list[Received]:
        attempt_id = uuid.uuid4().hex
        request: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": self.settings.sender.wait_seconds,
            "VisibilityTimeout": self.settings.sender.visibility_timeout,
            "MessageSystemAttributeNames": ["MessageGroupId"],
            # The same id on a retried receive makes SQS return the same messages
            # instead of hiding them until their visibility ends.
            "ReceiveRequestAttemptId": attempt_id,
        }
        for attempt in range(3):
            receive = asyncio.ensure_future(self.sqs.receive_message(**request))
            stopped = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({receive, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if receive not in done:
                # Shutting down mid-poll. An idle poll would hold the shutdown for
                # up to its whole wait, so it gets a moment to land, then is cut
                # off: SQS rarely hands a poll anything in that moment, and what
                # it does hand comes back after its visibility timeout. What
                # lands in time goes straight back for another replica.
                await asyncio.wait({receive}, timeout=_LAST_POLL_WAIT)
                if not receive.done():
                    receive.cancel()
                await self._hand_back(await asyncio.gather(receive, return_exceptions=True))
                return []
            try:
                response = receive.result()
            except Exception as exc:
                log.warning("SQS receive failed (attempt %d): %s", attempt + 1, exc)
                self.metrics.receive_failed()
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            self.stats.receives += 1
            raw = response.get("Messages", [])
            self.metrics.received(len(raw))
            if not raw:
                self.stats.empty_receives += 1
            return [
                Received(
                    message_id=m["MessageId"],
                    receipt=m["ReceiptHandle"],
                    group=m.get("Attributes", {}).get("MessageGroupId", ""),
                    body=m.get("Body", ""),
                )
                for m in raw
            ]
        return []

    async def _hand_back(self, results: Sequence[Any]) -> None:
        response = results[0]
        if isinstance(response, BaseException):
            return
        messages = [
            Received(message_id=m["MessageId"], receipt=m["ReceiptHandle"], group="", body="", visibility=0)
            for m in response.get("Messages", [])
        ]
        if messages:
            await self._settle_sqs(messages)

    # -- one batch -------------------------------------------------------------

    async def process(self, messages: list[Received]) -> None:
        """Handle one received batch: every message is deleted or given a new
        visibility before this returns; those whose quota frees within a
        moment are asked for again then (see :data:`PRECISE_WAIT_MAX`)."""
        self.stats.received += len(messages)
        for msg in messages:
            self._held[msg.receipt] = msg
        groups: dict[str, list[Received]] = {}
        for msg in messages:
            try:
                msg.envelope = decode(msg.body)
            except PoisonMessage as exc:
                await self._poison(msg, str(exc))
                continue
            groups.setdefault(msg.envelope.tenant, []).append(msg)
        await self._handle(messages, groups)

    async def _handle(self, messages: list[Received], groups: dict[str, list[Received]]) -> None:
        try:
            await asyncio.gather(*(self._process_group(tenant, group) for tenant, group in groups.items()))
            await self._settle_sqs(messages)
        except asyncio.CancelledError:
            # Shutdown cancelled the batch: it stays held, for release_held to hand back.
            raise
        except BaseException:
            self._release(messages)
            raise
        again = [m for m in messages if m.retry_at is not None and not m.delete]
        self._release([m for m in messages if m not in again])
        if again:
            delay = min(m.retry_at or 0.0 for m in again) - time.monotonic()
            timer = asyncio.create_task(self._ask_again(again, delay), name="sender-precise-retry")
            self._timers.add(timer)
            timer.add_done_callback(self._timer_done)

    async def _ask_again(self, messages: list[Received], delay: float) -> None:
        """The quota frees in less than a second or two: ask again at that moment.

        SQS counts visibility in whole seconds, so parking for 0.3 s would
        cost 1 s, a third of a per-second quota. The messages stay parked in
        SQS meanwhile (with a margin), so if this process dies they come back
        there; no worker slot is held while waiting, only this timer.
        """
        await asyncio.sleep(max(0.0, delay))
        groups: dict[str, list[Received]] = {}
        for msg in messages:
            msg.delete, msg.visibility, msg.retry_at = False, None, None
            assert msg.envelope is not None
            groups.setdefault(msg.envelope.tenant, []).append(msg)
        await self._handle(messages, groups)

    def _timer_done(self, timer: asyncio.Task[None]) -> None:
        self._timers.discard(timer)
        if not timer.cancelled() and timer.exception() is not None:
            # Its messages stay parked in SQS and come back when their visibility ends.
            log.error("timed quota retry failed", exc_info=timer.exception())

    def _release(self, messages: list[Received]) -> None:
        for msg in messages:
            self._held.pop(msg.receipt, None)

    async def _process_group(self, tenant: str, group: list[Received]) -> None:
        envelopes = [m.envelope for m in group if m.envelope is not None]
        states = await self._job_states([e.job_id for e in envelopes])
        todo: list[Received] = []
        seen: set[str] = set()
        for msg in group:
            assert msg.envelope is not None
            state = states.get(msg.envelope.job_id)
            if state in (JobState.SENT, JobState.DEAD) or msg.envelope.job_id in seen:
                # Sent already (a redelivery after a crash) or cancelled/dead: never again.
                # Twice in one batch (a replayed job's old message): once is enough.
                msg.delete = True
            else:
                seen.add(msg.envelope.job_id)
                todo.append(msg)
        if not todo:
            return
        if self.limits.is_paused(tenant):
            # An operator paused the tenant: its mail already in SQS waits too.
            await self._park(tenant, todo, PAUSED_RECHECK_SECONDS, "paused", int(time.time() * 1000))
            return
        costs = [m.envelope.mail.recipients for m in todo if m.envelope]
        grant = await self.quota.acquire(
            tenant,
            costs,
            self.limits.global_limits(),
            self.limits.limits_for(tenant),
            weight=self.settings.weight_for(tenant),
        )
        granted, refused = todo[: grant.granted], todo[grant.granted :]
        if refused:
            await self._park(tenant, refused, grant.retry_after, grant.blocked_by, grant.at_ms)
        granted = await self._claim_for_sending(tenant, granted, grant.at_ms)
        granted = await self._load_content(tenant, granted, grant.at_ms)
        stamps = [Stamp(grant.at_ms, time.monotonic()) for _ in granted]
        sends = [
            asyncio.ensure_future(self._send_one(tenant, m, stamp))
            for m, stamp in zip(granted, stamps, strict=True)
        ]
        try:
            await self._keep_answered_counted(tenant, granted, stamps, sends)
        except asyncio.CancelledError:
            for send in sends:
                send.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
            raise
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
        # Record every answer SES gave before raising any error: a sent mail left
        # unrecorded would be sent again when its message comes back.
        answered = [
            (m, r, stamp)
            for m, r, stamp in zip(granted, outcomes, stamps, strict=True)
            if isinstance(r, ses.SendResult)
        ]
        await self._record_sent(tenant, answered)
        if any(r.verdict is ses.Verdict.PAUSED for _, r, _ in answered):
            self._hold(self.settings.sender.pause_seconds)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _park(
        self, tenant: str, refused: list[Received], retry_after: float, blocked_by: str | None, at_ms: int
    ) -> None:
        if retry_after < 0:
            # More recipients than a window allows: it can never fit.
            for msg in refused[:1]:
                assert msg.envelope is not None
                await self._dead(
                    msg, "the mail has more recipients than a quota window allows", "too_many_recipients"
                )
            refused = refused[1:]
            retry_after = 1.0
        if not refused:
            return
        if blocked_by == "global":
            self._hold(retry_after)
        precise = blocked_by in ("tenant", "global", "share") and retry_after <= PRECISE_WAIT_MAX
        # Jitter spreads parked groups' return; a timed retry needs only a hair of it.
        jitter = PRECISE_JITTER if precise else self.settings.sender.max_jitter_seconds
        wait = min(retry_after + random.uniform(0, jitter), MAX_VISIBILITY)
        self.stats.throttled_by_quota += len(refused)
        self.metrics.throttled(tenant, _THROTTLE_REASON.get(blocked_by or "", "tenant_quota"), len(refused))
        now = time.monotonic()
        parked = self._parked.setdefault(tenant, {})
        for receipt in [r for r, until in parked.items() if until <= now]:
            del parked[receipt]
        for msg in refused:
            msg.visibility = wait + PRECISE_SAFETY_NET if precise else wait
            msg.retry_at = now + wait if precise else None
            parked[msg.receipt] = now + wait
        ids = [m.envelope.job_id for m in refused if m.envelope]
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hincrby(self.keys.job(job_id), "throttled", 1)
            await pipe.execute()
        # The jobs keep their tenant's in-flight slots while they wait in SQS.
        ttl_ms = int(self.settings.dispatcher.inflight_ttl_seconds * 1000)
        await self.store.touch_inflight(tenant, at_ms + int(wait * 1000) + ttl_ms)
        log.info(
            "tenant over quota (%s): %d mails wait %.2fs",
            blocked_by,
            len(refused),
            wait,
            extra={"tenant": tenant},
        )

    async def _send_one(self, tenant: str, msg: Received, stamp: Stamp) -> ses.SendResult:
        assert msg.envelope is not None
        try:
            result = await self._send_claimed(tenant, msg, stamp)
        except asyncio.CancelledError:
            # Shutdown mid-call: SES may have the mail. Keep the marker (it ends
            # with the message's visibility), so no other replica sends it meanwhile.
            if not msg.in_call:
                await self.store.redis.delete(self.keys.sending(msg.envelope.job_id))
            raise
        except BaseException:
            await self.store.redis.delete(self.keys.sending(msg.envelope.job_id))
            raise
        if result.verdict is not ses.Verdict.SENT:
            # A sent job's marker goes with its record, in _record_sent.
            await self.store.redis.delete(self.keys.sending(msg.envelope.job_id))
        return result

    async def _record_sent(self, tenant: str, answered: list[tuple[Received, ses.SendResult, Stamp]]) -> None:
        """Record a group's answers in one round trip (one pipeline): the quota units of
        every mail SES may have (sent, or failed in a way that leaves it unknown) move
        to the answer, summed per bucket they sat in; then each sent job is finished
        and its sending marker released. Per mail this was three round trips, the
        largest cost the daemon had over the calls it cannot avoid (bench/profile.py)."""
        counted: dict[int, int] = {}
        for msg, result, stamp in answered:
            if result.verdict in (ses.Verdict.SENT, ses.Verdict.TRANSIENT) and msg.envelope:
                counted[stamp.at_ms] = counted.get(stamp.at_ms, 0) + msg.envelope.mail.recipients
        sent = [(m, r) for m, r, _ in answered if r.verdict is ses.Verdict.SENT]
        if not counted and not sent:
            return
        windows = self.limits.global_limits(), self.limits.limits_for(tenant)
        sent_ms = int(time.time() * 1000)
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for at_ms, cost in counted.items():
                await self.quota.restamp(tenant, cost, at_ms, *windows, pipeline=pipe)
            for msg, result in sent:
                assert msg.envelope is not None
                await self.store.finish(
                    msg.envelope.job_id,
                    JobState.SENT,
                    keep_seconds=self._finished_ttl(),
                    fields={"ses_message_id": result.message_id or "", "sent_ms": sent_ms},
                    pipeline=pipe,
                )
            for msg, _ in sent:
                assert msg.envelope is not None
                pipe.delete(self.keys.sending(msg.envelope.job_id))
            await pipe.execute()

    async def _keep_answered_counted(
        self,
        tenant: str,
        granted: list[Received],
        stamps: list[Stamp],
        sends: Sequence[asyncio.Future[ses.SendResult]],
    ) -> None:
        """Wait for a group's SES calls. A mail SES answered early waits for the slowest
        of its group before _record_sent moves its units to the answer; until then it
        is kept counted like a mail in a call, or its units could leave the window
        (counted from the grant) before SES's count of it (from its arrival) does."""
        every = self._keep_counted_every(tenant)
        pending: set[asyncio.Future[ses.SendResult]] = set(sends)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=every)
            if not pending:
                return
            for msg, stamp, send in zip(granted, stamps, sends, strict=True):
                if not send.done() or send.cancelled() or send.exception() is not None:
                    continue
                if send.result().verdict in (ses.Verdict.SENT, ses.Verdict.TRANSIENT) and msg.envelope:
                    try:
                        await self._keep_counted(tenant, msg.envelope.mail.recipients, stamp, every)
                    except RedisError as exc:  # _record_sent restamps it anyway, or fails loudly
                        log.warning("could not keep an answered mail counted: %s", exc)

    def _keep_counted_every(self, tenant: str) -> float:
        """Half the shortest window: how long a granted mail may go unsent before its
        units must be moved forward, or they would leave that window too soon."""
        windows = (*self.limits.global_limits(), *self.limits.limits_for(tenant))
        return min((w.seconds for w in windows), default=1) / 2

    async def _keep_counted(self, tenant: str, cost: int, stamp: Stamp, every: float) -> None:
        """SES counts a mail when it arrives. A mail still waiting for an SES slot, or
        in a slow call, must stay counted until then: move its units to now."""
        if time.monotonic() - stamp.mono < every:
            return
        windows = self.limits.global_limits(), self.limits.limits_for(tenant)
        moved = await self.quota.restamp(tenant, cost, stamp.at_ms, *windows)
        if moved is not None:
            stamp.at_ms, stamp.mono = moved, time.monotonic()

    async def _send_claimed(self, tenant: str, msg: Received, stamp: Stamp) -> ses.SendResult:
        env = msg.envelope
        assert env is not None
        cost = env.mail.recipients
        every = self._keep_counted_every(tenant)
        async with self._ses_slots:
            await self._keep_counted(tenant, cost, stamp, every)
            started = time.monotonic()
            msg.in_call = True
            call = asyncio.ensure_future(ses.send(self.ses, env, self.settings.tenant(tenant)))
            try:
                while not (await asyncio.wait({call}, timeout=every))[0]:
                    await self._keep_counted(tenant, cost, stamp, every)
            except asyncio.CancelledError:
                call.cancel()
                raise
            result = call.result()
            msg.in_call = False
            self.metrics.ses_call(result.verdict.value, time.monotonic() - started)
        extra = {"job_id": env.job_id, "tenant": tenant}
        if result.verdict is ses.Verdict.SENT:
            # Restamped and recorded with the rest of its group: _record_sent.
            self._throttle_backoff = _THROTTLE_BACKOFF_MIN
            msg.delete = True
            self.stats.sent += 1
            self.metrics.sent(tenant, env.created_ms)
            return result
        if result.verdict is not ses.Verdict.TRANSIENT:
            # SES refused it outright: the quota units go back. After a 5xx or a
            # network error SES may have the mail, so its units stay counted.
            await self.quota.refund(
                tenant, cost, stamp.at_ms, self.limits.global_limits(), self.limits.limits_for(tenant)
            )
        self.stats.by_reason[result.verdict.value] = self.stats.by_reason.get(result.verdict.value, 0) + 1
        if result.verdict is ses.Verdict.THROTTLED:
            self.stats.throttled_by_ses += 1
            self.metrics.throttled(tenant, "ses")
            delay = self._throttle_backoff
            self._throttle_backoff = min(self._throttle_backoff * 2, _THROTTLE_BACKOFF_MAX)
            self._hold(delay)
            msg.visibility = delay + random.uniform(0, self.settings.sender.max_jitter_seconds)
            await self.store.redis.hincrby(self.keys.job(env.job_id), "throttled", 1)
            log.warning("SES throttled; sender backs off %.1fs", delay, extra=extra)
        elif result.verdict is ses.Verdict.PAUSED:
            msg.visibility = self.settings.sender.pause_seconds
            log.error(
                "SES refuses to send (%s); sender paused %.0fs",
                result.error,
                self.settings.sender.pause_seconds,
                extra=extra,
            )
        elif result.verdict is ses.Verdict.PERMANENT:
            await self._dead(msg, result.error or "rejected by SES", "rejected")
        else:
            attempts = int(await self.store.redis.hincrby(self.keys.job(env.job_id), "attempts", 1))
            await self.store.redis.hset(self.keys.job(env.job_id), "last_error", result.error or "")
            if attempts >= self.settings.sender.max_attempts:
                await self._dead(msg, f"gave up after {attempts} attempts: {result.error}", "attempts")
            else:
                self.stats.retried += 1
                self.metrics.retried(tenant)
                s = self.settings.sender
                msg.visibility = min(s.backoff_base_seconds * 2 ** (attempts - 1), s.backoff_max_seconds)
                log.warning("SES send failed (attempt %d): %s", attempts, result.error, extra=extra)
        return result

    async def _claim_for_sending(self, tenant: str, granted: list[Received], at_ms: int) -> list[Received]:
        """Take each job's sending marker; what another sender holds, or what ended
        meanwhile, is not sent here (and its quota units go back)."""
        if not granted:
            return granted
        ids = [m.envelope.job_id for m in granted if m.envelope]
        keys = [self.keys.job(i) for i in ids] + [self.keys.sending(i) for i in ids]
        lifetime_ms = self.settings.sender.visibility_timeout * 1000
        codes: list[int] = await self._send_claim(keys=keys, args=[lifetime_ms])
        claimed = []
        for msg, code in zip(granted, codes, strict=True):
            if code == 1:
                claimed.append(msg)
                continue
            assert msg.envelope is not None
            windows = self.limits.global_limits(), self.limits.limits_for(tenant)
            await self.quota.refund(tenant, msg.envelope.mail.recipients, at_ms, *windows)
            if code == 2:
                msg.delete = True
            elif code == 3:
                # No record (a purged dead letter, an expired one): a cancelled or
                # finished job's message would otherwise go out. Drop it.
                msg.delete = True
                self.stats.dropped += 1
                self.metrics.dropped(tenant, "no_record")
                log.warning(
                    "message dropped unsent: its job record is gone",
                    extra={"job_id": msg.envelope.job_id, "tenant": tenant},
                )
            else:
                # Back soon: by then the other sender has recorded the outcome.
                msg.visibility = _CLAIMED_ELSEWHERE_WAIT
        return claimed

    async def _load_content(self, tenant: str, granted: list[Received], at_ms: int) -> list[Received]:
        """Claim checks (envelope version 2): load each mail's MIME message from Redis,
        only once its quota is granted. A mail whose content is gone (purged, or a key
        that is not its own) is dead-lettered and its quota units are refunded."""
        stored = [m for m in granted if m.envelope is not None and m.envelope.content_key]
        if not stored:
            return granted
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for msg in stored:
                assert msg.envelope is not None
                pipe.get(self.keys.content(msg.envelope.job_id))
            contents = await pipe.execute()
        lost: set[str] = set()
        for msg, content in zip(stored, contents, strict=True):
            env = msg.envelope
            assert env is not None
            if content is None or env.content_key != self.keys.content(env.job_id):
                lost.add(msg.receipt)
                windows = self.limits.global_limits(), self.limits.limits_for(tenant)
                await self.quota.refund(tenant, env.mail.recipients, at_ms, *windows)
                await self._dead(msg, "the mail's content (a claim check) is gone from Redis", "poison")
            else:
                mail = dataclasses.replace(env.mail, raw=bytes(content))
                msg.envelope = dataclasses.replace(env, mail=mail)
        return [m for m in granted if m.receipt not in lost]

    # -- endings -----------------------------------------------------------------

    async def _dead(self, msg: Received, reason: str, kind: str) -> None:
        """``kind`` is the metrics label (mailer.metrics.DEAD_REASONS)."""
        assert msg.envelope is not None
        env = msg.envelope
        result = await self.store.finish(
            env.job_id,
            JobState.DEAD,
            keep_seconds=self._finished_ttl(),
            fields={"dead_reason": reason, "last_error": reason},
        )
        if result == -1:
            # No record (expired, or the Redis lost it): keep the mail as a dead letter anyway.
            await self._record_dead(env.job_id, env.tenant, reason, msg.body)
        msg.delete = True
        self.stats.dead += 1
        self.metrics.dead(env.tenant, kind)
        log.warning("dead letter: %s", reason, extra={"job_id": env.job_id, "tenant": env.tenant})

    async def _poison(self, msg: Received, reason: str) -> None:
        why = f"unreadable SQS message: {reason}"
        # A body this fairpost cannot read may still name its job (an envelope
        # from a newer fairpost, say): then that job ends dead, not lost in
        # "dispatched", and keeps its slot no longer.
        named = _job_id_in(msg.body)
        job_id = named or f"poison-{msg.message_id}"
        finished = -1
        if named:
            finished = await self.store.finish(
                named,
                JobState.DEAD,
                keep_seconds=self._finished_ttl(),
                fields={"dead_reason": why, "last_error": why, "raw_body": msg.body[:262_144]},
            )
        if finished == -1:
            job_id = f"poison-{msg.message_id}"
            await self._record_dead(job_id, msg.group, why, msg.body)
        msg.delete = True
        self.stats.dead += 1
        self.metrics.dead(msg.group, "poison")
        log.error("poison message dead-lettered: %s", reason, extra={"job_id": job_id, "tenant": msg.group})

    async def _record_dead(self, job_id: str, tenant: str, reason: str, raw_body: str) -> None:
        now_ms = int(time.time() * 1000)
        key = self.keys.job(job_id)
        async with self.store.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    "tenant": tenant,
                    "kind": "mail",
                    "state": JobState.DEAD.value,
                    "priority": "normal",
                    "created_ms": now_ms,
                    "finished_ms": now_ms,
                    "dead_reason": reason,
                    "last_error": reason,
                    "raw_body": raw_body[:262_144],
                    "attempts": 0,
                },
            )
            pipe.zadd(self.keys.dead(), {job_id: now_ms})
            pipe.expire(key, self._finished_ttl())
            await pipe.execute()

    async def _settle_sqs(self, messages: Sequence[Received]) -> None:
        deletes = [m for m in messages if m.delete]
        changes = [m for m in messages if not m.delete and m.visibility is not None]
        for chunk in _chunks(deletes, 10):
            entries = [{"Id": str(i), "ReceiptHandle": m.receipt} for i, m in enumerate(chunk)]
            response = await self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            for fail in response.get("Failed", []):
                # The message will come back; its job record says sent, so it is not sent twice.
                log.warning("SQS delete failed: %s", fail.get("Message", fail.get("Code")))
        for chunk in _chunks(changes, 10):
            visibilities: list[dict[str, Any]] = [
                {
                    "Id": str(i),
                    "ReceiptHandle": m.receipt,
                    # SQS counts whole seconds: round up, or a short wait becomes
                    # no wait at all and the message comes straight back.
                    "VisibilityTimeout": min(MAX_VISIBILITY, max(0, math.ceil(m.visibility or 0))),
                }
                for i, m in enumerate(chunk)
            ]
            response = await self.sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url, Entries=visibilities
            )
            for fail in response.get("Failed", []):
                log.warning("SQS visibility change failed: %s", fail.get("Message", fail.get("Code")))

    async def unpark(self, tenant: str | None = None) -> int:
        """Limits changed or a tenant was resumed (mailer.quota.overrides): bring the tenant's
        parked messages (every tenant's for ``None``) back now, to be weighed against
        the new limits, instead of at the time the old ones gave. Returns how many."""
        now = time.monotonic()
        tenants = list(self._parked) if tenant is None else [tenant]
        receipts: list[str] = []
        for name in tenants:
            parked = self._parked.pop(name, {})
            receipts += [r for r, until in parked.items() if until > now]
        for start in range(0, len(receipts), 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": 0}
                for i, r in enumerate(receipts[start : start + 10])
            ]
            # A failure is a message that came back (or went) already: nothing to do.
            await self.sqs.change_message_visibility_batch(QueueUrl=self.queue_url, Entries=entries)
        return len(receipts)

    async def release_held(self) -> int:
        """Shutdown: give every message received but not finished back to SQS at once."""
        for timer in list(self._timers):
            timer.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        # A message whose SES call was cut off is left to its visibility timeout:
        # SES may have it, and its sending marker lasts as long.
        held = [m for m in self._held.values() if not m.in_call]
        for m in held:
            if not m.delete:
                m.visibility = 0
        await self._settle_sqs(held)
        released = sum(1 for m in held if not m.delete)
        self.metrics.handed_back(released)
        return released

    # -- helpers -------------------------------------------------------------------

    async def _job_states(self, job_ids: list[str]) -> dict[str, str]:
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(self.keys.job(job_id), "state")
            values = await pipe.execute()
        states = {}
        for job_id, value in zip(job_ids, values, strict=True):
            if value is not None:
                states[job_id] = value.decode() if isinstance(value, bytes) else str(value)
        return states

    def _hold(self, seconds: float) -> None:
        self._hold_until = max(self._hold_until, time.monotonic() + seconds)

    def _finished_ttl(self) -> int:
        return self.settings.job_ttl


def _job_id_in(body: str) -> str | None:
    """The job id an unreadable envelope still carries, if any."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    job_id = data.get("job_id") if isinstance(data, dict) else None
    return job_id if isinstance(job_id, str) and job_id and len(job_id) <= 128 else None


def _chunks(items: Sequence[Received], size: int) -> list[Sequence[Received]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
