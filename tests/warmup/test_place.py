"""A place in a plan moves by the schedule while clean, holds while not, and ends on ``none``."""

from __future__ import annotations

import dataclasses
from typing import Any

from fairpost.config import load_settings
from fairpost.config.limits import parse_limits
from fairpost.mailer.quota.reputation import Reputation, WindowCounts
from fairpost.mailer.quota.warmup import Place, StepHold, advance, hold_for

PLAN = "1/second from 0s | 3/second from 10s | 5/second from 30s | none from 60s"
DIRTY = StepHold("bounce_rate", "bounce rate 2.50% over 24h (5 of 10 sends, counted as 200) >= 2.00%")


def place(**fields: Any) -> Place:
    return dataclasses.replace(Place(PLAN, "operator", started_ms=0, step=0, entered_ms=0), **fields)


def test_clean_steps_follow_the_schedule_and_none_ends_the_warm_up() -> None:
    start = place()
    assert advance(start, 9_999, None) == start
    assert advance(start, 10_000, None) == place(step=1, entered_ms=10_000)
    # Late by a refresh or two, the schedule keeps its due times.
    assert advance(start, 31_500, None) == place(step=2, entered_ms=30_000)
    assert advance(start, 60_000, None) is None
    assert place(step=1, entered_ms=10_000).limits == parse_limits("3/second")


def test_a_dirty_tenant_holds_its_step_and_later_steps_keep_their_length() -> None:
    held = advance(place(), 12_000, DIRTY)
    assert held == place(held="bounce_rate", why=DIRTY.why, held_ms=12_000)
    assert held is not None and held.limits == parse_limits("1/second")
    # Held, however long; the reason first given stays.
    assert advance(held, 500_000, StepHold("complaint_rate", "x")) == held
    # Clean again: the next step from now, and the one after 20 s later (its length).
    moved = advance(held, 500_000, None)
    assert moved == place(step=1, entered_ms=500_000)
    assert moved is not None and moved.due_ms() == 520_000
    assert advance(held, 519_999, None) == place(step=1, entered_ms=519_999)
    # A tenant whose next step is not due yet is not held, dirty or not.
    assert advance(place(), 5_000, DIRTY) == place()


def test_the_last_step_holds_when_the_plan_has_no_end() -> None:
    last = Place("1/second from 0s | 2/second from 1s", "default", 0, 1, 1_000)
    assert last.due_ms() is None
    assert advance(last, 10**12, None) == last


def test_a_place_round_trips_and_unreadable_ones_are_ignored() -> None:
    held = place(step=1, entered_ms=10_000, held="bounce_rate", why=DIRTY.why, held_ms=30_000)
    assert Place.from_json(held.to_json_text()) == held
    assert Place.from_json("not json") is None
    assert Place.from_json('{"plan": "nonsense", "source": "default"}') is None
    assert Place.from_json(place(step=7).to_json_text()) is None


def test_the_hold_reason_counts_as_the_guard_does_over_at_least_min_sends() -> None:
    settings = load_settings()

    def rep(sends: int, bounces: int, complaints: int = 0) -> Reputation:
        day = WindowCounts(86_400, sends, bounces, complaints, sends, bounces, complaints)
        return Reputation(
            "t",
            0,
            (day, WindowCounts(7 * 86_400, sends, bounces, complaints, sends, bounces, complaints)),
            None,
        )

    assert hold_for(rep(10, 3), settings) is None  # 3 of 200: 1.5 %
    hold = hold_for(rep(10, 4), settings)  # 4 of 200: 2 %
    assert hold is not None and hold.kind == "bounce_rate"
    assert hold.why == "bounce rate 2.00% over 24h (4 of 10 sends, counted as 200) >= 2.00%"
    assert hold_for(rep(1000, 19), settings) is None
    complaint = hold_for(rep(1000, 0, 1), settings)  # 1 of 1000: 0.1 % >= 0.05 %
    assert complaint is not None and complaint.kind == "complaint_rate"
    assert hold_for(rep(3000, 0, 1), settings) is None
