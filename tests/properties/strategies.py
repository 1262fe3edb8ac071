"""Strategies the property tests share: text an outsider may send, and JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

# Characters where parsers break: controls, separators, quotes, non-ASCII, surrogates aside.
TRICKY = st.sampled_from(
    [*"\x00\t\n\r\x0b\x1b\x7f\x85 \"'<>@:;,.()[]\\/%#?&=+~|!", "é", "Ä", "\u2028", "\ufeff", "\U0001d538"]
)
TEXT = st.text(st.one_of(st.characters(codec="utf-8"), TRICKY), max_size=120)
ASCII = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=80)

JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def with_holes(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``base`` with some of its fields replaced by any JSON or dropped."""
    keys = sorted(base)
    changes = st.dictionaries(st.sampled_from(keys), st.one_of(st.just(None), JSON), max_size=len(keys))
    drops = st.sets(st.sampled_from(keys), max_size=2)

    def apply(pair: tuple[dict[str, Any], set[str]]) -> dict[str, Any]:
        changed, dropped = pair
        out = {**base, **changed}
        return {k: v for k, v in out.items() if k not in dropped}

    return st.tuples(changes, drops).map(apply)


T = TypeVar("T")


def accepted(call: Callable[[], T], *refusals: type[Exception]) -> T | None:
    """What ``call`` answers, or None if it raised one of its documented refusals
    (with a message saying why); any other exception fails the property."""
    try:
        return call()
    except refusals as exc:
        assert str(exc), "a refusal that says nothing"
        return None
