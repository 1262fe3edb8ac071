"""dispatcher/lua_shake.py: a script gets the helpers of ring.lua it calls, directly or
through another, and no other; each assembled script defines every helper it names."""

from __future__ import annotations

import re

import pytest

from fairpost.dispatcher.calls import _RING_SCRIPTS, script
from fairpost.dispatcher.lua_shake import used_helpers
from fairpost.dispatcher.scripts import lua_source

LIBRARY = """-- a comment naming unused()
local LIMIT = 3

local function inner(x)
  return x + LIMIT
end

local function outer(x)
  return inner(x) * 2
end

local function unused()
  return 0
end
"""


def test_a_helper_called_through_another_is_kept_and_one_named_in_a_comment_only_is_not() -> None:
    kept = used_helpers(LIBRARY, "-- unused() is not called\nreturn outer(1)\n")
    assert "local function outer(" in kept and "local function inner(" in kept
    assert "local function unused(" not in kept
    # Every line that is no helper stays, in its place.
    assert kept.startswith("-- a comment naming unused()\nlocal LIMIT = 3\n")


def test_a_helper_with_no_end_at_the_start_of_a_line_is_refused() -> None:
    with pytest.raises(ValueError, match="no 'end'"):
        used_helpers("local function broken()\n  return 1\n  end\n", "broken()")


@pytest.mark.parametrize("name", sorted(_RING_SCRIPTS))
def test_every_ring_helper_a_script_names_is_defined_in_it(name: str) -> None:
    ring = lua_source("fairpost.dispatcher", "ring")
    helpers = re.findall(r"^local function (\w+)\(", ring, re.MULTILINE)
    source = script(name)
    code = re.sub(r"--[^\n]*", "", source)
    named = {h for h in helpers if re.search(rf"\b{h}\(", code)}
    defined = set(re.findall(r"^local function (\w+)\(", source, re.MULTILINE))
    assert named <= defined
    # And ring.lua's helpers are not all there for every script: handoff.lua uses few.
    if name == "handoff":
        assert len(defined & set(helpers)) < len(helpers) / 2
