"""Every Redis key the dispatcher writes, built in one place.

All keys share one hash tag, ``{prefix}``, because the Lua scripts touch
keys of many tenants at once (the fair pick): on Redis Cluster they must live
in one slot.

A job kind keeps its own keys in a subclass of :class:`Keys` under the same
prefix, and tells the dispatcher what it needs through three hooks (docs/design.md, "Job kinds"):

- :meth:`Keys.busy_markers`: keys whose existence means a worker is at a job
  right now. finish.lua deletes them; cancel.lua refuses a job that has one
  (:class:`~fairpost.dispatcher.errors.TooLateToCancel` names the marker's
  state); defer.lua leaves such a job as it is; reconcile.lua counts one as
  progress.
- :meth:`Keys.data_keys`: keys a store with data holds one of (layout.lua), so
  that a store holding only the kind's data is not taken for an empty one.
- :meth:`Keys.history_fields`: the record fields a finished job's line in the
  history keeps (dispatcher/history.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

__all__ = [
    "ANCHOR",
    "BULK",
    "BULK_LANES",
    "LANES",
    "PRIORITIES",
    "TOTAL_INFLIGHT",
    "TOTAL_WAITING",
    "WAKE_SCHEDULED",
    "WAKE_TOKENS_MOST",
    "WAKE_WORK",
    "BusyMarker",
    "HistoryField",
    "Keys",
    "lane",
    "pack_history",
]

PRIORITIES = ("high", "normal", "low")

BULK = "bulk."
"""What a bulk lane's name puts before its priority. A job of a bulk lane is claimed
only when its tenant has nothing waiting in the other lanes, and never takes the last
quarter of its tenant's in-flight slots (``ring.lua``), so a tenant's bulk backlog never
delays its urgent jobs."""
BULK_LANES = tuple(BULK + p for p in PRIORITIES)
LANES = PRIORITIES + BULK_LANES
"""Every queue of a tenant, in the order the claim takes them (``ring.lua``)."""


def lane(priority: str, *, bulk: bool) -> str:
    """The queue a job of ``priority`` waits in: its bulk lane for bulk work."""
    return BULK + priority if bulk else priority


TOTAL_WAITING = "~waiting"
"""The field of :meth:`Keys.counts` with the jobs waiting over every tenant (``~``
is not allowed in tenant ids)."""
WAKE_WORK = "1"
"""A wake token (:meth:`Keys.wake`): a tenant may have become claimable."""
WAKE_SCHEDULED = "s"
"""A wake token: a scheduled job is due before any other was; look for due ones."""
WAKE_TOKENS_MOST = 64
"""Wake tokens the list keeps (ring.lua trims it to as many): a dispatcher takes them all at once."""
TOTAL_INFLIGHT = "~inflight"
"""The field of :meth:`Keys.counts` with the in-flight slots over every tenant."""
ANCHOR = "\n~ not a job: its score, +inf, keeps this sorted set in Redis's skiplist encoding ~\n"
"""A member of :meth:`Keys.dispatched` and of :meth:`Keys.leases`, scored ``+inf``, that
no job id can be (none holds a newline, :data:`~fairpost.dispatcher.record.ENTRY_SEP`).
Redis keeps a sorted set of up to 128 members (``zset-max-listpack-entries``) as a
listpack, and each member added or removed there is a scan of the whole set: the
index of jobs in SQS, tens of them under load, cost some 20,000 instructions of
Redis's a job, and a claim's few dozen leases some 4,300 (#41). A member longer than
``zset-max-listpack-value`` (64 bytes) makes it a skiplist, which Redis never turns
back. handoff.lua writes it with every hand-off, claim.lua with every claim's leases
(first in the ZADD: a set an earlier version made a listpack is turned before the
jobs go in); no reader sees it (the reconciler and the reaper read only the due,
by score, none of the rest reads all of either set); the script that takes a set's
last job out takes it too (ring.lua's drop_lone_anchor; reconcile.lua, of an index
an earlier version left holding it alone), so that an idle store keeps neither."""


@dataclass(frozen=True)
class BusyMarker:
    """A key per job whose existence means a worker is at the job right now (a job
    kind's, named by :meth:`Keys.busy_markers`): ``<prefix><job id>``. The worker sets it
    (with a TTL, in a script of its own); the dispatcher only reads and deletes it."""

    state: str
    """What a cancel refused for this marker reports as the job's state
    (:class:`~fairpost.dispatcher.errors.TooLateToCancel`)."""
    prefix: str

    def key(self, job_id: str) -> str:
        return self.prefix + job_id


_NOT_IN_HISTORY = frozenset(",;|")
"""What a line's layout (history.lua's history_layout) and the line itself use as separators."""


@dataclass(frozen=True)
class HistoryField:
    """A record field a finished job's line in the history keeps (a job kind's, named by
    :meth:`Keys.history_fields`, dispatcher/history.py)."""

    name: str
    default: str = ""
    """The value a line leaves out: the reader takes a field the record lacks as this."""
    after_created: bool = False
    """A time (ms) kept as the ms after the record's ``created_ms``: shorter."""

    def __post_init__(self) -> None:
        for what, value in (("name", self.name), ("default", self.default)):
            if _NOT_IN_HISTORY & set(value) or (what == "name" and not value):
                raise ValueError(f"HistoryField {what} {value!r}: must be non-empty, without , ; or |")

    def packed(self) -> str:
        """As history.lua's history_layout reads it: ``name,default,1`` (``1``: after created)."""
        return f"{self.name},{self.default},{'1' if self.after_created else ''}"


@cache
def pack_history(fields: tuple[HistoryField, ...]) -> str:
    """The fields as one ARGV string for the history's scripts (history.lua's history_layout)."""
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ValueError(f"history fields {names}: each may appear once")
    if any(f.after_created for f in fields) and "created_ms" not in names:
        raise ValueError(f"history fields {names}: a time kept after created_ms needs created_ms")
    return ";".join(f.packed() for f in fields)


@dataclass(frozen=True)
class Keys:
    prefix: str = "fairpost"

    @property
    def root(self) -> str:
        return "{" + self.prefix + "}"

    # -- the layout (dispatcher/layout.py, dispatcher/migrate.py) -------------
    def layout(self) -> str:
        """String: the key layout's version, kept once; none on a store written before
        versions (0.1.0 reads it as layout 0)."""
        return f"{self.root}:layout"

    def migrate_lock(self) -> str:
        """String with a TTL: the ``fairpost migrate`` that runs now (a redis-py lock)."""
        return f"{self.root}:migrate:lock"

    def migrate_cursor(self) -> str:
        """String: where a migration's scan stands (a SCAN cursor), so that a rerun after
        a kill resumes there; gone once the layout is stamped."""
        return f"{self.root}:migrate:cursor"

    # -- jobs ----------------------------------------------------------------
    def job(self, job_id: str) -> str:
        """Hash: the job record (state, tenant, kind, timestamps: short values, so
        that Redis keeps it as a listpack; dispatcher/record.py)."""
        return f"{self.root}:job:{job_id}"

    def payload(self, job_id: str) -> str:
        """String: the job's payload, beside its record (dispatcher/record.py)."""
        return f"{self.root}:payload:{job_id}"

    def payload_prefix(self) -> str:
        return f"{self.root}:payload:"

    def job_prefix(self) -> str:
        """What :meth:`job` puts before the id, for Lua scripts that build keys."""
        return f"{self.root}:job:"

    def queue(self, tenant: str, priority: str) -> str:
        """List: ids of the tenant's waiting jobs of one lane (:data:`LANES`), head first."""
        return f"{self.root}:q:{tenant}:{priority}"

    def queue_prefix(self) -> str:
        return f"{self.root}:q:"

    # -- the fair pick -------------------------------------------------------
    def ring(self) -> str:
        """List: tenants with waiting jobs and a free in-flight slot, in turn order."""
        return f"{self.root}:ring"

    def ring_members(self) -> str:
        """Set: the tenants in :meth:`ring`, to keep each there once."""
        return f"{self.root}:ring:members"

    def blocked(self) -> str:
        """Set: tenants with waiting jobs but no free in-flight slot."""
        return f"{self.root}:blocked"

    def expiring(self) -> str:
        """Sorted set: tenants holding in-flight slots, scored at or before their
        earliest handed-off slot's expiry (ms): the reaper visits only those due."""
        return f"{self.root}:expiring"

    def counts(self) -> str:
        """Hash: tenant → jobs waiting in its queues, and the totals over every
        tenant (:data:`TOTAL_WAITING`, :data:`TOTAL_INFLIGHT`): counted by the
        scripts as work happens, so that no view reads every tenant."""
        return f"{self.root}:counts"

    def backlog_top(self) -> str:
        """Sorted set: tenants whose backlog reached 2 or more, scored by the largest
        power of two it reached since (readers put stale scores right): the
        largest backlogs, to within a factor of two, without a sorted-set write
        per job."""
        return f"{self.root}:backlog-top"

    def deficit(self) -> str:
        """Hash: tenant → deficit-round-robin credit."""
        return f"{self.root}:deficit"

    def weights(self) -> str:
        """Hash: tenant → weight, for tenants that differ from the default."""
        return f"{self.root}:weights"

    def caps(self) -> str:
        """Hash: tenant → in-flight cap, for tenants that differ from the default."""
        return f"{self.root}:caps"

    def paused(self) -> str:
        """Set: tenants an operator paused; they keep their queue but leave the ring."""
        return f"{self.root}:paused"

    def inflight(self, tenant: str) -> str:
        """Sorted set: the tenant's claimed or handed-off jobs, scored by expiry (ms)."""
        return f"{self.root}:inflight:{tenant}"

    def inflight_prefix(self) -> str:
        return f"{self.root}:inflight:"

    def leases(self) -> str:
        """Sorted set: claimed jobs not yet handed off, scored by lease deadline (ms), and
        :data:`ANCHOR`."""
        return f"{self.root}:leases"

    def claim(self, token: str) -> str:
        """The jobs one claim leased (claim.lua): a string, the claim's time, then its
        job ids, each after :data:`~fairpost.dispatcher.record.ENTRY_SEP`, kept for a
        lease, so that the claim asked again under its token answers them."""
        return f"{self.root}:claim:{token}"

    def wake(self) -> str:
        """List: tokens that wake an idle dispatcher blocked on BLPOP: :data:`WAKE_WORK`
        (a tenant may be claimable) or :data:`WAKE_SCHEDULED` (dispatcher/ring.lua)."""
        return f"{self.root}:wake"

    def dispatched(self) -> str:
        """Sorted set: dispatched jobs, scored by when they count as stranded unless
        they show progress first (ms; dispatcher/reconcile.lua), and :data:`ANCHOR`."""
        return f"{self.root}:dispatched"

    def reconciled(self) -> str:
        """Hash: what the reconciler did, outcome → count, for stats."""
        return f"{self.root}:reconciled"

    def history_days(self) -> str:
        """Hash: day (days since the epoch, UTC) -> the number of the day's history
        buckets, and ``<day>:n`` -> the lines written that day (dispatcher/history.lua)."""
        return f"{self.root}:hist-days"

    def history_prefix(self) -> str:
        """What the history's buckets' names start with: ``<prefix><day>:<n>``, each a
        hash with a TTL, job id -> its line (dispatcher/history.lua)."""
        return f"{self.root}:hist:"

    def tenants(self) -> str:
        """Set: every tenant that ever enqueued, for stats."""
        return f"{self.root}:tenants"

    def dead(self) -> str:
        """Sorted set: dead-lettered job ids, scored by when they died (ms)."""
        return f"{self.root}:dead"

    # -- job lifecycle (scheduled send, idempotency, claim checks) -------------
    def scheduled(self) -> str:
        """Sorted set: ids of jobs waiting for their send time, scored by it (ms)."""
        return f"{self.root}:scheduled"

    def idempotency(self, tenant: str, key: str) -> str:
        """String with a TTL: the id of the job first sent with this idempotency key."""
        return f"{self.root}:idem:{tenant}:{key}"

    def content(self, job_id: str) -> str:
        """String: a job's content kept beside its record (too big for the job's
        downstream: a claim check)."""
        return f"{self.root}:content:{job_id}"

    def content_prefix(self) -> str:
        return f"{self.root}:content:"

    # -- the journal (dispatcher/journal.py) -------------------------------------
    def outcomes(self) -> str:
        """Stream: the journal of jobs' outcomes (dispatcher/journal.py); trimmed by age
        and length."""
        return f"{self.root}:outcomes"

    # -- what a job kind adds (the module's docstring) ----------------------------
    def busy_markers(self) -> tuple[BusyMarker, ...]:
        """The markers a worker sets while it is at a job: none of the dispatcher's own;
        a job kind's keys name theirs."""
        return ()

    def data_keys(self) -> list[str]:
        """Keys a store with data holds one of (dispatcher/layout.py)."""
        return [self.tenants(), self.counts(), self.dead(), self.scheduled(), self.outcomes()]

    def history_fields(self) -> tuple[HistoryField, ...]:
        """The record fields a finished job's line in the history keeps, in its order
        after its state and tenant (dispatcher/history.py): the dispatcher's own; a job
        kind's keys name theirs."""
        return (
            HistoryField("priority", "normal"),
            HistoryField("created_ms"),
            HistoryField("dispatched_ms", after_created=True),
            HistoryField("finished_ms", after_created=True),
            HistoryField("attempts", "0"),
        )
