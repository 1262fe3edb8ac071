"""The reconciler: no job is left ``dispatched`` once SQS no longer holds it.

SQS can stop holding a job's message without fairpost doing anything: a
queue ``RedrivePolicy`` moves it to a dead-letter queue after
``maxReceiveCount`` receives (every quota park is a receive), an operator
purges the queue, the retention period ends. The job would stay
``dispatched`` forever, neither sent nor dead.

Every few seconds the reconciler asks the store for dispatched jobs that
made no progress for longer than they can legitimately wait
(:meth:`config.Settings.stranded_after_seconds`, derived from the windows,
the visibility timeout, the retry delays and the in-flight TTL) and hands
each one to SQS again with a deduplication id of its own. That is safe even
if the old message still exists somewhere: a job recorded as sent is never
sent again (its record and its sending marker). After
``FAIRPOST_RECONCILE_HANDOFFS`` such hand-offs a job that is lost once more
becomes a dead letter with the reason. Every replica with the dispatcher
role runs one; the scan is atomic, so they never pick the same job twice in
a round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.loop import forever
from fairpost.dispatcher.store import JobStore
from fairpost.dispatcher.stranded import SCAN_BATCH, Stranded, StrandedJobs
from fairpost.dispatcher.worker import Dead, HandedOff
from fairpost.mailer.daemon.handoff import MailWorker
from fairpost.mailer.daemon.metrics import Metrics

log = logging.getLogger("fairpost.reconcile")

RETRY_FAILED_HANDOFF_MS = 30_000
"""A hand-off again that did not reach SQS is tried again this much later."""


@dataclass
class ReconcileReport:
    handed_again: int = 0
    dead: int = 0
    failed: int = 0


def dead_reason(handoffs: int) -> str:
    return (
        "stranded: SQS no longer held its message (a queue redrive policy, a purge or the "
        f"retention period), and it was handed to SQS again {handoffs} times"
    )


class Reconciler:
    def __init__(
        self,
        store: JobStore,
        worker: MailWorker,
        settings: Settings,
        *,
        metrics: Metrics | None = None,
        interval: float | None = None,
        may_act: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """``may_act``: asked before each scan; False skips it (the daemon passes
        "a sender replica is alive": with none, nothing receives from SQS, so no
        job can show progress and none may be taken for lost)."""
        self.store = store
        self.stranded = StrandedJobs(store.redis, store.keys, store.limits)
        self.worker = worker
        self.settings = settings
        self.metrics = metrics or worker.metrics
        # Often enough to notice within a small part of the wait that defines
        # "stranded", rarely enough to cost nothing: each scan is one script call.
        self.may_act = may_act
        self._waiting_for_senders = False
        self.interval = interval or min(30.0, max(1.0, settings.stranded_after_seconds() / 10))

    async def run(self, stop: asyncio.Event) -> None:
        async def scan() -> float:
            report = await self.run_once()
            # A full batch: more may be stranded, so the next scan comes at once.
            busy = report.handed_again + report.dead >= SCAN_BATCH
            return 0.0 if busy else self.interval

        backoff = OutageBackoff(self.settings.max_outage_seconds, most=min(10.0, self.interval))
        await forever("reconciler", scan, stop, backoff=backoff, on_error=self.metrics.task_failed)

    async def run_once(self) -> ReconcileReport:
        """One scan: hand stranded jobs to SQS again, or end them dead."""
        report = ReconcileReport()
        if self.may_act is not None and not await self.may_act():
            if not self._waiting_for_senders:
                log.warning("no sender replica is alive: jobs in SQS are not taken for lost meanwhile")
            self._waiting_for_senders = True
            return report
        self._waiting_for_senders = False
        picked = await self.stranded.scan(self.settings.reconcile_handoffs)
        for item in picked:
            if item.outcome == "dead":
                await self._dead(item, dead_reason(item.handoffs))
                report.dead += 1
        again = [item for item in picked if item.outcome == "again"]
        if not again:
            return report
        outcomes = await self.worker.hand_off(
            [item.job for item in again], again={item.job.id: item.handoffs for item in again}
        )
        failed: list[str] = []
        for item, outcome in zip(again, outcomes, strict=True):
            extra = {"job_id": item.job.id, "tenant": item.job.tenant}
            if isinstance(outcome, HandedOff):
                report.handed_again += 1
                self.metrics.reconciled("handed_again")
                log.warning(
                    "job made no progress for %.0fs: SQS no longer holds it; handed to SQS again (%d of %d)",
                    self.settings.stranded_after_seconds(),
                    item.handoffs,
                    self.settings.reconcile_handoffs,
                    extra=extra,
                )
            elif isinstance(outcome, Dead):
                await self._dead(item, outcome.reason)
                report.dead += 1
            else:
                failed.append(item.job.id)
                log.warning("could not hand a stranded job to SQS again; retrying soon", extra=extra)
        if failed:
            report.failed = len(failed)
            await self.stranded.handoff_failed(failed, RETRY_FAILED_HANDOFF_MS)
        return report

    async def _dead(self, item: Stranded, reason: str) -> None:
        await self.store.finish(
            item.job.id,
            JobState.DEAD,
            keep_seconds=self.settings.job_ttl,
            fields={"dead_reason": reason, "last_error": reason},
        )
        self.metrics.reconciled("dead")
        self.metrics.dead(item.job.tenant, "stranded")
        log.error("dead letter: %s", reason, extra={"job_id": item.job.id, "tenant": item.job.tenant})
