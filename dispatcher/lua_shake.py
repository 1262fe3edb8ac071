"""Only the helpers a script uses, of a library prepended to it (calls.script).

Every call of a script runs its text from the top: each ``local function`` of a
prepended library makes a closure, used or not. ring.lua's 24 helpers cost a
call some 22,700 instructions of Redis's (a micro-measure under callgrind), a
handoff.lua that uses 10 of them 8,000. A library is read as its top-level
pieces: a ``local function NAME(`` through the ``end`` that closes it at the
start of a line, or any other line (constants, comments), kept as it is. A
helper is kept when its name is a word of the script's own code (comments left
out) or of a helper kept: a Lua local is called only by its name, so nothing a
script can call is left out.
"""

from __future__ import annotations

import re

_DEFINED = re.compile(r"local function (\w+)\(")
_WORD = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--[^\n]*")


def _pieces(library: str) -> list[tuple[str | None, str]]:
    """The library's top-level pieces: (a helper's name, its text), or (None, a line)."""
    lines = library.splitlines(keepends=True)
    pieces: list[tuple[str | None, str]] = []
    at = 0
    while at < len(lines):
        found = _DEFINED.match(lines[at])
        if not found:
            pieces.append((None, lines[at]))
            at += 1
            continue
        end = at
        while lines[end].rstrip("\r\n") != "end":
            end += 1
            if end == len(lines):
                raise ValueError(f"local function {found.group(1)}: no 'end' opens a line after it")
        pieces.append((found.group(1), "".join(lines[at : end + 1])))
        at = end + 1
    return pieces


def _words(code: str) -> set[str]:
    return set(_WORD.findall(_COMMENT.sub("", code)))


def used_helpers(library: str, script: str) -> str:
    """``library`` with only the helpers ``script`` (the rest of the script's text)
    calls, itself or through a helper it calls; every other line kept."""
    pieces = _pieces(library)
    helpers = {name: text for name, text in pieces if name}
    kept: set[str] = set()
    wanted = [name for name in helpers if name in _words(script)]
    while wanted:
        name = wanted.pop()
        if name not in kept:
            kept.add(name)
            wanted += sorted(_words(helpers[name]) & helpers.keys() - kept)
    return "".join(text for name, text in pieces if name is None or name in kept)
