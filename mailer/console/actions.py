"""What the console's buttons do, through the same calls the CLI makes
(``fairpost tenant``, ``quota``, ``suppression``, ``dead``), each logged:
who (the session), what, which tenant or job.

Blocking, like the admin clients they use: the app runs them in a thread.
Each acts in the tenant's own sending pool (or the job's: job ids are unique over
every pool), as the CLI does. Bad input raises the admin's own :class:`~fairpost.mailer.errors.InvalidInput`
(naming the field and the rule) and writes nothing.
"""

from __future__ import annotations

import logging

from fairpost.config.limits import format_limits
from fairpost.dispatcher.errors import NotReplayable, UnknownJob
from fairpost.mailer.console.data import Console
from fairpost.mailer.console.pools import PoolParts
from fairpost.mailer.errors import ConfirmationStale, InvalidInput, InvalidSuppression
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.dead import DeadLetter

__all__ = ["Actions"]

log = logging.getLogger("fairpost.console")


class Actions:
    def __init__(self, console: Console) -> None:
        self._console = console

    def _did(self, who: str, what: str, *, tenant: str | None = None, job_id: str | None = None) -> str:
        extra = {k: v for k, v in (("tenant", tenant), ("job_id", job_id)) if v is not None}
        log.info("console: %s by %s", what, who, extra=extra)
        return what

    def _admin(self, tenant: str) -> QuotaAdmin:
        """The quota admin of the tenant's pool."""
        return self._console.pools.of_sync(tenant).admin

    def _pool_of_letter(self, job_id: str) -> PoolParts:
        """The pool whose dead letters hold the job; :class:`UnknownJob` if none does."""
        for pool in self._console.pools:
            try:
                pool.dead.show(job_id)
            except UnknownJob:
                continue
            return pool
        raise UnknownJob(job_id)

    # -- tenants --------------------------------------------------------------------
    def pause(self, who: str, tenant: str) -> str:
        changed = self._admin(tenant).pause(tenant)
        return self._did(who, "paused" if changed else "paused (it was paused already)", tenant=tenant)

    def resume(self, who: str, tenant: str) -> str:
        changed = self._admin(tenant).resume(tenant)
        return self._did(who, "resumed" if changed else "resumed (nothing held it)", tenant=tenant)

    def set_limits(self, who: str, tenant: str, limits: str) -> str:
        if not limits.strip():
            raise InvalidInput(
                "limits", 'must be limits such as "100/minute; 5000/day" (Reset drops the override)'
            )
        windows = self._admin(tenant).set_tenant_limits(tenant, limits)
        return self._did(who, f"limits set to {format_limits(windows)}", tenant=tenant)

    def reset_limits(self, who: str, tenant: str) -> str:
        removed = self._admin(tenant).reset_tenant_limits(tenant)
        return self._did(
            who, "limits back to the settings" if removed else "limits had no override", tenant=tenant
        )

    def suppress(self, who: str, tenant: str, address: str) -> str:
        added = self._console.suppressions.add(tenant, address)
        # The log names the tenant, never the address.
        return self._did(
            who, "address suppressed" if added else "address was suppressed already", tenant=tenant
        )

    def unsuppress(self, who: str, tenant: str, ref: str) -> str:
        """Remove the address the form names by its reference (the page may show it masked)."""
        entries = self._console.suppressions.list(tenant)
        found = [e.address for e in entries if self._console.address_ref(e.address) == ref]
        if not found:
            raise InvalidSuppression("address", "is not on the list (any more): reload the page")
        self._console.suppressions.remove(tenant, found[0])
        return self._did(who, "address removed from the suppression list", tenant=tenant)

    # -- dead letters ---------------------------------------------------------------
    def replay(self, who: str, job_id: str) -> str:
        """Raises :class:`NotReplayable` or :class:`UnknownJob`."""
        self._pool_of_letter(job_id).dead.replay(job_id)
        return self._did(who, "replayed", job_id=job_id)

    def purge(self, who: str, job_id: str) -> str:
        pool = self._pool_of_letter(job_id)  # UnknownJob unless it is a dead letter
        letter = pool.dead.show(job_id)
        pool.lifecycle.purge([letter.job_id])
        return self._did(who, "purged", job_id=job_id, tenant=letter.tenant_id)

    def _confirmed(self, tenant: str, reason: str, expected: int) -> list[DeadLetter]:
        letters = self._console.matching_dead(tenant, reason)
        if len(letters) != expected:
            raise ConfirmationStale(expected, len(letters))
        return letters

    def replay_matching(self, who: str, tenant: str, reason: str, expected: int) -> str:
        replayed, skipped = 0, 0
        for letter in self._confirmed(tenant, reason, expected):
            try:
                self._console.dead.replay(letter.job_id)
                replayed += 1
            except (NotReplayable, UnknownJob):
                skipped += 1
        what = f"replayed {replayed} dead letters" + (f" ({skipped} not replayable)" if skipped else "")
        return self._did(who, what + _filter(tenant, reason), tenant=tenant or None)

    def purge_matching(self, who: str, tenant: str, reason: str, expected: int) -> str:
        letters = self._confirmed(tenant, reason, expected)
        count = self._console.dead_pool(tenant).lifecycle.purge([d.job_id for d in letters])
        return self._did(who, f"purged {count} dead letters" + _filter(tenant, reason), tenant=tenant or None)


def _filter(tenant: str, reason: str) -> str:
    parts = [f"tenant {tenant}" if tenant else "", f"reason containing {reason!r}" if reason.strip() else ""]
    said = " and ".join(p for p in parts if p)
    return f" ({said})" if said else ""
