"""What each dispatcher script is called with, and what its answer means.

The one call builder under both faces of the queues (:class:`~fairpost.dispatcher.store.JobStore`
and :class:`~fairpost.dispatcher.store.SyncJobStore`), both faces of a job's lifecycle
(:class:`~fairpost.dispatcher.lifecycle.Lifecycle`, :class:`~fairpost.dispatcher.lifecycle.SyncLifecycle`)
and the quota admin's resume: the faces only send a call and hand its answer here,
as httpx's ``Client`` and ``AsyncClient`` share ``BaseClient``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis.exceptions

from fairpost.config import Settings
from fairpost.dispatcher.durable import Durability
from fairpost.dispatcher.errors import NotReplayable, RedisNearlyFull, TooLateToCancel, UnknownJob
from fairpost.dispatcher.jobs import Job, JobState, NewJob
from fairpost.dispatcher.journal import Entry, Journal, entry_args, journal_args, journal_keys
from fairpost.dispatcher.keys import ANCHOR, Keys, pack_history
from fairpost.dispatcher.lua_shake import used_helpers
from fairpost.dispatcher.record import ENTRY_SEP
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source

__all__ = [
    "CANCELLED",
    "RING_GOES_HERE",
    "Call",
    "ScriptCalls",
    "StoreLimits",
    "cancelled",
    "claimed",
    "history_hash",
    "promoted",
    "replayed",
    "script",
    "store_limits",
    "submitted",
]

CANCELLED = "cancelled"
"""The dead reason of a cancelled job."""

Args = list[str | int | bytes]
Call = tuple[list[str], Args]
"""A script's KEYS and ARGV."""

_RING_SCRIPTS = frozenset(
    {
        "enqueue",
        "claim",
        "handoff",
        "requeue",
        "reap",
        "finish",
        "promote",
        "cancel",
        "replay",
        "resume",
        "defer",
    }
)
"""The scripts that change the ring of tenants or its counters, and so open with ring.lua."""

_JOURNAL_SCRIPTS = frozenset({"finish", "cancel", "dead_letter", "defer"})
"""The scripts that end jobs, and so append to the journal (journal.lua, dispatcher/journal.py)."""

_HISTORY_SCRIPTS = frozenset({"finish", "history_read", "history_outcome"})
"""The scripts that write or read the history of finished jobs (history.lua, dispatcher/history.py)."""


RING_GOES_HERE = "-- ring.lua goes here\n"
"""A line in a script that opens with a check of its own: ring.lua goes there
instead of first (defining its helpers is most of what a call that stops at
the check would cost)."""


def script(name: str) -> str:
    """The text of ``dispatcher/<name>.lua``, with ring.lua (the context and helpers
    every script that changes the ring shares) first, or at :data:`RING_GOES_HERE`,
    when it needs it."""
    source = lua_source("fairpost.dispatcher", name)
    journal = lua_source("fairpost.dispatcher", "journal") + "\n" if name in _JOURNAL_SCRIPTS else ""
    history = lua_source("fairpost.dispatcher", "history") + "\n" if name in _HISTORY_SCRIPTS else ""
    if name in _RING_SCRIPTS:
        # Only the helpers the rest calls (dispatcher/lua_shake.py).
        ring = used_helpers(lua_source("fairpost.dispatcher", "ring"), history + journal + source) + "\n"
        head, marker, body = source.partition(RING_GOES_HERE)
        source = head + ring + body if marker else ring + source
    source = history + journal + source
    if name == "enqueue":
        # The shebang makes Redis (7.0+) check for out-of-memory before the script
        # starts, not at each write inside it: a batch is refused whole, never cut.
        source = "#!lua\n" + source
    return source


@dataclass(frozen=True)
class StoreLimits:
    """The defaults a tenant without an override gets."""

    default_weight: int = 1
    default_cap: int = 20
    lease_ms: int = 30_000
    inflight_ttl_ms: int = 1_800_000
    stranded_after_ms: int = 1_800_000 + 60_000 + 900_000
    """A dispatched job without progress this long is stranded (Settings.stranded_after_seconds)."""
    min_replicas: int = 0
    """Replicas an enqueue and a "sent" record wait for (FAIRPOST_REDIS_MIN_REPLICAS)..."""
    wait_ms: int = 1000
    """... for at most this long (FAIRPOST_REDIS_WAIT_SECONDS)."""
    journal_max_length: int = 0
    """The journal the scripts that end jobs append to (:meth:`Keys.outcomes`, dispatcher/journal.py)
    keeps about this many entries (FAIRPOST_OUTCOMES__MAX_LENGTH); 0: there is no journal."""
    journal_max_age_ms: int = 0
    """... none older than this (FAIRPOST_OUTCOMES__MAX_AGE); 0: any age."""
    high_water: float = 0.0
    """An enqueue is refused above this share of Redis's maxmemory (FAIRPOST_REDIS_HIGH_WATER); 0: never."""
    detail_seconds: int = 0
    """A sent job's record stays whole this long, then its line in the history answers
    for it (FAIRPOST_JOB_DETAIL_TTL, dispatcher/history.py); 0: no history, the record
    stays whole for the finish's ``keep_seconds``."""
    history_shards: int = 16
    """The fewest buckets a day in the history (FAIRPOST_HISTORY_SHARDS)."""

    @property
    def durability(self) -> Durability:
        return Durability(self.min_replicas, self.wait_ms)


def store_limits(settings: Settings) -> StoreLimits:
    return StoreLimits(
        default_weight=settings.default_weight,
        default_cap=settings.inflight_cap,
        lease_ms=int(settings.dispatcher.lease_seconds * 1000),
        inflight_ttl_ms=int(settings.dispatcher.inflight_ttl_seconds * 1000),
        stranded_after_ms=int(settings.stranded_after_seconds() * 1000),
        min_replicas=settings.redis_min_replicas,
        wait_ms=int(settings.redis_wait_seconds * 1000),
        journal_max_length=settings.outcomes.max_length if settings.outcomes.enabled else 0,
        journal_max_age_ms=int(settings.outcomes.max_age * 1000),
        high_water=settings.redis_high_water,
        detail_seconds=settings.job_detail_ttl if settings.job_detail_ttl < settings.job_ttl else 0,
        history_shards=settings.history_shards,
    )


def journal_of(keys: Keys, limits: StoreLimits) -> Journal | None:
    """The journal the store's scripts append to, if any."""
    if limits.journal_max_length <= 0:
        return None
    return Journal(keys.outcomes(), limits.journal_max_length, limits.journal_max_age_ms)


def outcome_journal(settings: Settings) -> Journal | None:
    """The journal fairpost's own jobs end in: the outcome feed (docs/outcomes.md)."""
    return journal_of(Keys(settings.key_prefix), store_limits(settings))


def history_hash(job_id: str) -> int:
    """What picks the job's bucket among a day's N in the history: its number is this
    modulo N. history.lua's history_bucket, made here for finish.lua (a SHA-1 in
    its Lua cost each line some thousands of instructions)."""
    return int(hashlib.sha1(job_id.encode()).hexdigest()[:8], 16)


class ScriptCalls:
    """Builds the KEYS and ARGV of each script (see each ``.lua`` file's header)."""

    def __init__(self, keys: Keys, limits: StoreLimits) -> None:
        self.keys = keys
        self.limits = limits
        self.journal = journal_of(keys, limits)

    def _ring_keys(self) -> list[str]:
        k = self.keys
        return [
            k.ring(),
            k.ring_members(),
            k.blocked(),
            k.caps(),
            k.wake(),
            k.paused(),
            k.counts(),
            k.expiring(),
            k.backlog_top(),
        ]

    def _ring_args(self) -> Args:
        return [self.keys.queue_prefix(), self.keys.inflight_prefix(), self.limits.default_cap]

    def _stranded_margin(self) -> int:
        """How long after a slot's kept expiry its job counts as stranded (ms)."""
        return self.limits.stranded_after_ms - self.limits.inflight_ttl_ms

    # -- the queues --------------------------------------------------------------
    def enqueue(self, jobs: Sequence[NewJob]) -> Call:
        """One call for the whole batch (enqueue.lua): all or nothing."""
        k = self.keys
        keys = [*self._ring_keys(), k.tenants(), k.scheduled()]
        args: Args = [*self._ring_args(), len(jobs), ENTRY_SEP, repr(self.limits.high_water)]
        args += [k.content_prefix(), k.payload_prefix()]
        for job in jobs:
            # Only what the job has: each string passed costs Lua's work (enqueue.lua).
            options: Args = ["send_at", job.send_at_ms] if job.send_at_ms > 0 else []
            fields: Args = []
            if job.idempotency_key:
                idem = k.idempotency(job.tenant, job.idempotency_key)
                options += ["idem", idem, "idem_ttl", job.idempotency_ttl] if job.idempotency_ttl > 0 else []
                # Kept on the record for the journal's entries (dispatcher/journal.py).
                fields += ["idempotency_key", job.idempotency_key]
            if job.content:
                options += ["content", job.content]
            fields += [part for pair in (job.fields or {}).items() for part in pair]
            keys.append(k.job(job.id))
            # Its queue entry whole (dispatcher/record.py): Lua would copy the payload to make it.
            args += [job.id, job.tenant, job.priority, f"{job.id}{ENTRY_SEP}{job.payload}", job.kind]
            args += [len(options) // 2, *options, len(fields) // 2, *fields]
        return keys, args

    def claim(self, count: int, token: str) -> Call:
        k = self.keys
        keys = [*self._ring_keys(), k.deficit(), k.weights(), k.leases(), k.claim(token)]
        limits = self.limits
        args: Args = [count, limits.default_weight, limits.lease_ms, k.job_prefix(), limits.inflight_ttl_ms]
        args += [k.payload_prefix(), ENTRY_SEP, ANCHOR]
        return keys, [*self._ring_args(), *args]

    def handoff(self, job_ids: Sequence[str], claimed_ms: int = 0) -> Call:
        """``claimed_ms``: when the jobs' claims were made, the earliest (0: not known)."""
        k, limits = self.keys, self.limits
        leased_until = claimed_ms + limits.lease_ms if claimed_ms > 0 else 0
        args: Args = [k.job_prefix(), limits.inflight_ttl_ms, limits.stranded_after_ms, ANCHOR, leased_until]
        return [*self._ring_keys(), k.leases(), k.dispatched()], [*self._ring_args(), *args, *job_ids]

    def renew(self, job_ids: Sequence[str]) -> Call:
        k = self.keys
        return [k.leases()], [k.job_prefix(), k.inflight_prefix(), self.limits.lease_ms, *job_ids]

    def requeue(self, job_ids: Sequence[str]) -> Call:
        return [*self._ring_keys(), self.keys.leases()], [
            *self._ring_args(),
            self.keys.job_prefix(),
            *job_ids,
        ]

    def reap(self, max_leases: int) -> Call:
        return [*self._ring_keys(), self.keys.leases()], [
            *self._ring_args(),
            self.keys.job_prefix(),
            max_leases,
        ]

    def finish(
        self,
        jobs: Sequence[tuple[str, Mapping[str, str | int] | None]],
        state: str,
        keep_seconds: int,
        entries: Mapping[str, Entry] | None = None,
    ) -> Call:
        """One call for every (job id, fields to set) given (finish.lua); ``state``: a
        final one (:meth:`JobStore.finish`); ``entries``: job id → what its journal
        entry adds (dispatcher/journal.py)."""
        k, journal = self.keys, self.journal
        markers = k.busy_markers()
        keys = [*self._ring_keys(), k.leases(), k.dead(), k.dispatched(), k.history_days()]
        args: Args = [*self._ring_args(), str(state), keep_seconds, len(markers)]
        history = self._history_args(str(state), keep_seconds)
        args += [*history, *journal_args(journal)]
        for job_id, fields in jobs:
            keys += [k.job(job_id), k.content(job_id), k.payload(job_id)]
            keys += [marker.key(job_id) for marker in markers]
            pairs: Args = []
            for name, value in (fields or {}).items():
                pairs += [name, value]
            args.append(job_id)
            if history[0]:
                args.append(history_hash(job_id))
            args += [len(pairs) // 2, *pairs, *entry_args((entries or {}).get(job_id))]
        return keys + journal_keys(journal), args

    def _history_args(self, state: str, keep_seconds: int) -> Args:
        """finish.lua's history (history.lua): none unless the jobs end sent and a
        record's detail TTL is shorter than the ``keep_seconds`` the history keeps
        its line."""
        detail = self.limits.detail_seconds
        if state != JobState.SENT or not 0 < detail < keep_seconds:
            return ["", 0, 0, 0]
        fields = self.keys.history_fields()
        pack_history(fields)  # checked as the history's readers take them
        args: Args = [self.keys.history_prefix(), detail, self.limits.history_shards, len(fields)]
        args += [f.name for f in fields]
        args += [f.default for f in fields]
        return args + ["1" if f.after_created else "" for f in fields]

    def defer(
        self, job_ids: Sequence[str], wait_ms: int, reason: str, entries: Mapping[str, Entry] | None = None
    ) -> Call:
        """One call for the jobs (defer.lua): each scheduled again ``wait_ms`` from now,
        waiting for ``reason``; ``entries``: job id → its journal entry, appended when
        it starts to wait for that reason."""
        k, journal = self.keys, self.journal
        markers = k.busy_markers()
        keys = [*self._ring_keys(), k.leases(), k.dispatched(), k.scheduled()]
        args: Args = [*self._ring_args(), wait_ms, reason, len(markers), *journal_args(journal)]
        for job_id in job_ids:
            keys += [k.job(job_id), *(marker.key(job_id) for marker in markers)]
            args += [job_id, *entry_args((entries or {}).get(job_id))]
        return keys + journal_keys(journal), args

    def touch(self, tenant: str, until_ms: int) -> Call:
        return [self.keys.inflight(tenant), self.keys.dispatched()], [until_ms, self._stranded_margin()]

    def keep(self, keep_ms: int, due_ms: int, offset: int, page: int) -> Call:
        k = self.keys
        args: Args = [k.inflight_prefix(), keep_ms, due_ms, self._stranded_margin(), offset, page]
        return [k.expiring(), k.dispatched()], args

    def dead_letter(
        self,
        job_id: str,
        tenant: str,
        kind: str,
        reason: str,
        fields: Mapping[str, str],
        keep_seconds: int,
    ) -> Call:
        journal = self.journal
        keys = [self.keys.job(job_id), self.keys.dead(), *journal_keys(journal)]
        args: Args = [job_id, tenant, kind, reason, keep_seconds, len(fields)]
        for name, value in fields.items():
            args += [name, value]
        return keys, [*args, *journal_args(journal), *entry_args(None)]

    # -- a job's lifecycle -----------------------------------------------------------
    def promote(self, max_jobs: int) -> Call:
        keys = [*self._ring_keys(), self.keys.scheduled()]
        return keys, [*self._ring_args(), self.keys.job_prefix(), max_jobs]

    def cancel(self, job_id: str, keep_seconds: int) -> Call:
        k = self.keys
        markers = k.busy_markers()
        keys = [
            *self._ring_keys(),
            k.job(job_id),
            k.scheduled(),
            k.leases(),
            k.dead(),
            k.content(job_id),
            k.payload(job_id),
            *(marker.key(job_id) for marker in markers),
            *journal_keys(self.journal),
        ]
        args: Args = [*self._ring_args(), job_id, keep_seconds, CANCELLED, len(markers)]
        args += [marker.state for marker in markers]
        return keys, [*args, *journal_args(self.journal), *entry_args(None)]

    def replay(self, job_id: str) -> Call:
        k = self.keys
        keys = [*self._ring_keys(), k.job(job_id), k.dead(), k.content(job_id), k.payload(job_id)]
        return keys, [*self._ring_args(), job_id]

    def purge(self, job_ids: Sequence[str], tenant: str | None) -> Call:
        k = self.keys
        return [k.dead()], [k.job_prefix(), k.content_prefix(), k.payload_prefix(), tenant or "", *job_ids]

    def resume(self, tenant: str) -> Call:
        return self._ring_keys(), [*self._ring_args(), tenant]


# -- answers ---------------------------------------------------------------------------


_FULL = re.compile(r"FAIRPOST_FULL (\d+) (\d+)")


@contextmanager
def refused_when_full(high_water: float) -> Iterator[None]:
    """enqueue.lua's refusal above the high-water mark, raised as :class:`RedisNearlyFull`."""
    try:
        yield
    except redis.exceptions.ResponseError as exc:
        found = _FULL.search(str(exc))
        if found is None:
            raise
        raise RedisNearlyFull(int(found[1]), int(found[2]), high_water) from None


def submitted(result: Any) -> tuple[bool, str]:
    """enqueue.lua's answer: (written, the job's id, or the first job's for a repeated
    idempotency key)."""
    code, job_id = result
    return int(code) == 1, text(job_id)


def claimed(flat: Sequence[Any]) -> list[Job]:
    """claim.lua's answer: seven values per claimed job, then the claim's time."""
    at = int(flat[-1]) if len(flat) % 7 else 0
    return [
        Job(
            id=text(flat[i]),
            tenant=text(flat[i + 1]),
            kind=text(flat[i + 2]),
            payload=text(flat[i + 3]),
            attempts=int(flat[i + 4]),
            created_ms=int(flat[i + 5]),
            replays=int(flat[i + 6]),
            claimed_ms=at,
        )
        for i in range(0, len(flat) - 6, 7)
    ]


def promoted(result: Any) -> tuple[int, float | None]:
    """(jobs moved, seconds until the next scheduled job is due or None)."""
    moved, wait_ms = int(result[0]), int(result[1])
    return moved, (None if wait_ms < 0 else wait_ms / 1000)


def cancelled(job_id: str, result: Any) -> str:
    """The state the job had; raises if it was not cancelled now.

    Cancelling a job cancelled already is not an error: the call is idempotent.
    """
    code = int(result[0])
    if code == -1:
        raise UnknownJob(job_id)
    if code == 0:
        state, reason = text(result[1]), text(result[2])
        if state == "dead" and reason == CANCELLED:
            return state
        raise TooLateToCancel(job_id, state)
    return text(result[1])


def replayed(job_id: str, result: Any) -> None:
    code = int(result[0])
    if code == -1:
        raise UnknownJob(job_id)
    if code == 0:
        raise NotReplayable(job_id, f"it is {text(result[1])}, not a dead letter")
    if code == -2:
        raise NotReplayable(job_id, "it has no content to send (an unreadable SQS message, kept as raw_body)")
