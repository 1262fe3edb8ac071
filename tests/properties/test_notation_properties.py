"""The limits notation (``14/second; 50000/day``) and the warm-up plan notation
(``50/hour from 0s | none from 7 days``), read from settings, the CLI and the
console: any text is a value or ``ValueError``, nothing else; a value read is
within the documented bounds, and its own text reads back the same."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fairpost.config.limits import MAX_COUNT, MAX_WINDOW_SECONDS, format_limits, parse_limits
from fairpost.config.warmup import MAX_OFFSET_SECONDS, parse_plan
from tests.properties.strategies import TEXT, accepted

UNITS = st.sampled_from(["second", "seconds", "minute", "hour", "day", "days", "s", "Minute", "week", "ms"])
COUNTS = st.one_of(st.integers(-5, 10**12).map(str), st.text("0123456789", min_size=1, max_size=30))
LIMIT = st.one_of(
    st.builds(lambda c, u: f"{c}/{u}", COUNTS, UNITS),
    st.builds(lambda c, n, u: f"{c} per {n} {u}", COUNTS, COUNTS, UNITS),
    TEXT,
)
LIMITS = st.lists(LIMIT, max_size=4).map("; ".join)
OFFSETS = st.builds(lambda n, u: f"{n} {u}", COUNTS, UNITS)
PLANS = st.lists(
    st.builds(lambda lim, off: f"{lim} from {off}", st.one_of(LIMITS, st.just("none")), OFFSETS), max_size=4
).map(" | ".join)


@given(st.one_of(TEXT, LIMITS))
def test_limits_are_read_within_bounds_and_back_from_their_own_text(text: str) -> None:
    windows = accepted(lambda: parse_limits(text), ValueError)
    if windows is None:
        return
    assert windows and list(windows) == sorted(windows)
    assert len({w.seconds for w in windows}) == len(windows)
    for window in windows:
        assert 1 <= window.limit <= MAX_COUNT and 1 <= window.seconds <= MAX_WINDOW_SECONDS
    assert parse_limits(format_limits(windows)) == windows


@given(st.one_of(TEXT, PLANS))
def test_plans_are_read_within_bounds_and_back_from_their_own_text(text: str) -> None:
    plan = accepted(lambda: parse_plan(text), ValueError)
    if plan is None:
        return
    offsets = [step.offset for step in plan.steps]
    assert offsets[0] == 0 and offsets == sorted(set(offsets))
    assert all(0 <= o <= MAX_OFFSET_SECONDS for o in offsets)
    assert plan.steps[0].limits is not None
    assert all(step.limits is not None for step in plan.steps[:-1])
    assert parse_plan(str(plan)) == plan
