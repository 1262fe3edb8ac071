"""Lua scripts, loaded from the ``.lua`` files beside the modules that use them."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

WRITES_FIRST = (
    "do local tag = string.match(KEYS[1] or '', '^{[^}]*}') "
    "if tag then redis.call('DEL', tag .. ':no-such-key') end end\n"
)
"""The first line of every script: a write that adds nothing (the DEL of a key that
never exists, in fairpost's hash slot). At ``maxmemory`` under ``noeviction`` Redis
refuses a script's first write if it could add memory, and lets a script that has
written finish, so that it is never cut half-way. With this line first, a full
Redis still lets the daemon claim, send and record what it drains, each script
adding a few small keys while the finish it records frees the job's payload
(docs/design.md, "Redis memory"). The SDK's enqueue is refused at a full Redis all
the same: its ``#!lua`` shebang makes Redis check memory before it starts."""


LIBRARIES = frozenset({"ring", "journal", "history", "deliveries", "windows"})
"""Helpers prepended to other scripts (dispatcher/calls.py, journal.py, and a job
kind's own, by the module that loads them): the script they join writes first, once
(history.lua, not named here, had finish.lua write it twice a call)."""


@cache
def lua_source(package: str, name: str) -> str:
    """The text of ``<package>/<name>.lua``, read once per process; a script's (not a
    library's) after :data:`WRITES_FIRST`."""
    source = (files(package) / f"{name}.lua").read_text(encoding="utf-8")
    return source if name in LIBRARIES else WRITES_FIRST + source
