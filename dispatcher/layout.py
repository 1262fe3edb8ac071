"""The key layout's version: one string under the prefix, :meth:`Keys.layout`.

Every key fairpost writes, and the fields of the records it keeps (the job
record, dispatcher/record.py, among them), make up one layout. Its version is
kept once: a daemon reads it before anything else and refuses to start on one
it cannot read, naming what fixes it; ``fairpost migrate`` (dispatcher/migrate.py)
moves a store from the layout before to this one and stamps it.

A release reads its own layout and the one before, and writes its own: a
release that changes the layout reads the new one already in the release
before it, so that old and new daemons can share a Redis while replicas roll
(README, "Versions and upgrades"). Adding a field or a key that readers may
ignore is no change of layout; removing or renaming one, or changing what a
value means, is.

Layout 0 is a store written before versions (no :meth:`Keys.layout`): 0.1.0
reads it as it is (its keys are layout 1's but for fields no release wrote),
and ``fairpost migrate`` stamps it. A store with no data at all is stamped
with this release's layout by the first daemon or migration that reads it.
"""

from __future__ import annotations

import redis
import redis.asyncio

from fairpost.dispatcher.errors import LayoutNotReadable
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source

__all__ = ["LAYOUT", "MIGRATE_COMMAND", "READS", "layout_call", "read_layout", "read_layout_sync", "verdict"]

LAYOUT = 1
"""The layout this fairpost writes."""
READS = (0, 1)
"""The layouts it reads: its own and the one before."""
MIGRATE_COMMAND = "fairpost migrate"


def layout_call(keys: Keys) -> tuple[list[str], list[str]]:
    """layout.lua's keys and arguments: a store with any of these keys has data."""
    return [keys.layout(), *keys.data_keys()], [str(LAYOUT)]


def verdict(found: str, *, writes: int = LAYOUT, reads: tuple[int, ...] = READS) -> int:
    """The layout version ``found`` (layout.lua's answer; '' is layout 0) if this
    fairpost reads it; otherwise :class:`LayoutNotReadable`, naming what fixes it."""
    text = found or "0"
    if not text.isdigit():
        raise LayoutNotReadable(
            repr(found), reads, f"no fairpost writes that: delete the layout key and run `{MIGRATE_COMMAND}`"
        )
    version = int(text)
    if version > writes:
        raise LayoutNotReadable(
            text, reads, "a newer fairpost wrote it: run a release that reads it (CHANGELOG.md)"
        )
    if version not in reads:
        raise LayoutNotReadable(
            text, reads, f"run `{MIGRATE_COMMAND}` (CHANGELOG.md's upgrade notes say with which release)"
        )
    return version


async def read_layout(client: redis.asyncio.Redis, keys: Keys) -> int:
    """The store's layout version, stamped first on a store with no data (layout.lua)."""
    names, args = layout_call(keys)
    found = await client.register_script(lua_source("fairpost.dispatcher", "layout"))(keys=names, args=args)
    return verdict(text(found))


def read_layout_sync(client: redis.Redis, keys: Keys) -> int:
    """:func:`read_layout` for a synchronous client (the command line)."""
    names, args = layout_call(keys)
    found = client.register_script(lua_source("fairpost.dispatcher", "layout"))(keys=names, args=args)
    return verdict(text(found))
