"""``fairpost migrate``: a store moved to this release's key layout (dispatcher/layout.py).

Locked: one migration at a time (a redis-py lock under :meth:`Keys.migrate_lock`,
its TTL renewed each batch); a second waits for the first and then finds nothing
to do. Idempotent: every step leaves a record as the step wants it, so running a
step again changes nothing. Resumable: the scan's cursor is saved after each
batch (:meth:`Keys.migrate_cursor`), and a rerun after a kill goes on from there
(a batch done but not yet saved is done again, which is harmless). The layout
is stamped last, so a store is never stamped half-migrated.

Layout 0 to 1 (0.1.0): a record's legacy ``payload`` field, which a
pre-release fairpost wrote, moves to its payload key (migrate_payload.lua);
then the layout is stamped 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import redis
from redis.lock import Lock

from fairpost.dispatcher.errors import MigrationBusy
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.layout import LAYOUT, read_layout_sync
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source

__all__ = ["Migration"]

LEGACY_PAYLOAD = "payload"
"""The record field a pre-release layout kept the payload in."""


@dataclass
class Migration:
    client: redis.Redis
    keys: Keys
    say: Callable[[str], None]
    batch: int = 500
    lock_seconds: float = 60.0
    """The lock's TTL, renewed each batch: a killed migration's lock frees by then."""

    def run(self, wait_seconds: float = 120.0) -> int:
        """Migrate to :data:`LAYOUT`; returns how many records changed."""
        lock = Lock(
            self.client, self.keys.migrate_lock(), timeout=self.lock_seconds, blocking_timeout=wait_seconds
        )
        if not lock.acquire():
            raise MigrationBusy(
                f"another fairpost migrate held the lock for over {wait_seconds:g}s; try again"
            )
        try:
            found = read_layout_sync(self.client, self.keys)
            if found == LAYOUT:
                self.say(f"key layout {LAYOUT}: nothing to do")
                return 0
            moved = self._move_payloads(lock)
            with self.client.pipeline(transaction=True) as pipe:
                pipe.set(self.keys.layout(), str(LAYOUT))
                pipe.delete(self.keys.migrate_cursor())
                pipe.execute()
            self.say(f"moved {moved} legacy payload field(s) to their keys")
            self.say(f"key layout {found} -> {LAYOUT}: done")
            return moved
        finally:
            lock.release()

    def dry_run(self) -> int:
        """Say what :meth:`run` would do, writing nothing; returns how many records
        it would change."""
        raw = self.client.get(self.keys.layout())
        if raw is not None and text(raw) == str(LAYOUT):
            self.say(f"key layout {LAYOUT}: nothing to do")
            return 0
        found = "0 (unversioned, before 0.1.0)" if raw is None else text(raw)
        cursor = self.client.get(self.keys.migrate_cursor())
        if cursor is not None:
            self.say(f"a migration stopped at scan cursor {text(cursor)}: it would start again from the top")
        legacy = 0
        for names, _ in self._scan(0):
            with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hexists(name, LEGACY_PAYLOAD)
                legacy += sum(1 for present in pipe.execute() if present)
        self.say(f"key layout {found} -> {LAYOUT}")
        self.say(f"would move {legacy} legacy payload field(s) to their keys")
        self.say(f"would stamp key layout {LAYOUT}")
        return legacy

    def _move_payloads(self, lock: Lock) -> int:
        script = self.client.register_script(lua_source("fairpost.dispatcher", "migrate_payload"))
        saved = self.client.get(self.keys.migrate_cursor())
        start = int(text(saved)) if saved is not None else 0
        if start:
            self.say(f"resuming at scan cursor {start}")
        moved = 0
        for names, cursor in self._scan(start):
            if names:
                job_ids = [name[len(self.keys.job_prefix()) :] for name in names]
                pairs = [k for n, j in zip(names, job_ids, strict=True) for k in (n, self.keys.payload(j))]
                moved += int(script(keys=pairs))
            self.client.set(self.keys.migrate_cursor(), str(cursor))
            lock.reacquire()
        return moved

    def _scan(self, start: int) -> Iterator[tuple[list[str], int]]:
        """The job records, a SCAN page at a time: their keys, and the cursor after them."""
        match, cursor = _glob(self.keys.job_prefix()) + "*", start
        while True:
            cursor, found = self.client.scan(cursor, match=match, count=self.batch, _type="hash")
            cursor = int(cursor)
            yield [text(name) for name in found], cursor
            if cursor == 0:
                return


def _glob(prefix: str) -> str:
    """``prefix`` as a SCAN pattern that matches it literally."""
    return re.sub(r"([\[\]*?\\])", r"\\\1", prefix)
