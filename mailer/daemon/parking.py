"""Parking: a tenant's refused mail waits in SQS until its quota frees or its hold is
looked at again, one place for every reason (the quota, a hold, SES's verdict on the
tenant's SES tenant).

Only the first mail of a group waits in flight; the rest go back to the queue
behind it, where FIFO order keeps them. A wait under :data:`PRECISE_WAIT_MAX` is
timed by this process (a :class:`~fairpost.mailer.daemon.settlement.TimedRetry`),
every other is SQS's visibility (a :class:`~fairpost.mailer.daemon.settlement.Park`).
Both the group's decision and SES's answers park through it, so it is built before
either and handed to both (fairpost.mailer.daemon.parts).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.inbox import MAX_VISIBILITY, Received
from fairpost.mailer.daemon.settlement import HAND_BACK, Park, Settlement, TimedRetry

log = logging.getLogger("fairpost.sender")

PRECISE_WAIT_MAX = 2.0
"""Quota waits up to this long are timed by the sender itself, to the millisecond."""

PRECISE_JITTER = 0.002
"""The jitter of a timed wait for the global quota (or a share of it): replicas
waiting for the same freed units need not wake at the same ms, but every ms of it
keeps freed units unused (on the bench's shared global quota, 10 ms of jitter
leave 1.5 ms of each window's units unused, 0.15 %: docs/design.md, "Where a
binding global quota's units go")."""

PRECISE_SAFETY_NET = 10.0
"""Seconds added to the SQS visibility of a mail the sender times itself: if the
process dies, the mail comes back from SQS this much later."""

_THROTTLE_REASON = {
    "global": "global_quota",
    "tenant": "tenant_quota",
    "share": "global_share",
}
"""The quota engine's ``blocked_by`` → the metrics label; a held tenant's park is
labelled with its hold's reason itself (fairpost.mailer.daemon.holds)."""


class Parking:
    def __init__(self, ctx: SenderContext, gate: Gate, endings: Endings) -> None:
        self.ctx = ctx
        self.gate = gate
        self.endings = endings

    async def park(
        self,
        tenant: str,
        refused: list[Received],
        retry_after: float,
        blocked_by: str | None,
        at_ms: int,
        *,
        never: str | None = None,
        label: str | None = None,
        overrule: bool = False,
    ) -> None:
        """The refused mails wait in SQS until ``retry_after`` seconds from now.

        Only the first waits in flight: the rest go straight back to the queue,
        where FIFO order keeps them behind it. So a throttled tenant holds one
        message of SQS's 120,000 in-flight limit, not a receive's worth. A wait
        this process times itself (under PRECISE_WAIT_MAX) keeps the group: it is
        asked for again in a moment, and handing it back would only cost SQS calls
        to receive it again.

        ``overrule``: the mails were decided this round already (their SES answers),
        and their group's answers taken together park them instead.
        """
        ctx = self.ctx
        settle = Received.overrule if overrule else Received.decide
        if retry_after < 0:
            # More recipients than a window allows: the head can never fit.
            refused = await self._never_fits(refused, never, settle)
            retry_after = 1.0
        if not refused:
            return
        waiting = refused
        precise = blocked_by in ("tenant", "global", "share") and retry_after <= PRECISE_WAIT_MAX
        if not precise:
            for behind in refused[1:]:
                settle(behind, HAND_BACK)
            refused = refused[:1]
        self._tell_gate(blocked_by, retry_after)
        wait = _wait(retry_after, blocked_by, precise, ctx.settings.sender.max_jitter_seconds)
        ctx.stats.throttled_by_quota += len(refused)
        # ``label``: a finer reason than the scope's (a warm-up step's limit).
        reason = label or _THROTTLE_REASON.get(blocked_by or "", blocked_by or "tenant_quota")
        ctx.metrics.throttled(tenant, reason, len(refused))
        now = time.monotonic()
        for msg in waiting:
            if msg.trace is not None:
                msg.trace.wait(reason, wait)
        for msg in refused:
            settle(
                msg,
                TimedRetry(now + wait, PRECISE_SAFETY_NET, tenant) if precise else Park(wait, tenant, reason),
            )
        ids = [m.envelope.job_id for m in refused if m.envelope]
        await ctx.mail.count_throttled(ids, reason, at_ms + int(wait * 1000))
        # The jobs keep their tenant's in-flight slots while they wait in SQS.
        await ctx.holds.keep_alive(tenant, at_ms + int(wait * 1000))
        log.info(
            "tenant over quota (%s): its next mail waits %.2fs", blocked_by, wait, extra={"tenant": tenant}
        )

    def _tell_gate(self, blocked_by: str | None, retry_after: float) -> None:
        """The global quota is spent (the gate closes until it frees), or binds as shares
        (the gate asks the quota before its next receives)."""
        if blocked_by == "global":
            self.gate.hold_for_quota(retry_after)
        elif blocked_by == "share":
            self.gate.quota_binds()

    async def _never_fits(
        self, refused: list[Received], never: str | None, settle: Callable[[Received, Settlement], None]
    ) -> list[Received]:
        """The head ends dead (``never`` names the window it can never fit,
        quota.engine.never_fits_reason); the rest are returned, to wait."""
        for msg in refused[:1]:
            assert msg.envelope is not None
            reason = never or "the mail has more recipients than a quota window allows"
            settle(msg, await self.endings.dead(msg, reason, "too_many_recipients"))
        return refused[1:]


def _wait(retry_after: float, blocked_by: str | None, precise: bool, max_jitter: float) -> float:
    """The park's length. Jitter spreads parked groups' return; a timed retry for the
    global quota needs only a hair of it, one for the tenant's own quota none: no one
    else waits for that quota, and a late retry only leaves it unused."""
    jitter = max_jitter
    if precise:
        jitter = 0.0 if blocked_by == "tenant" else PRECISE_JITTER
    return min(retry_after + random.uniform(0, jitter), MAX_VISIBILITY)
