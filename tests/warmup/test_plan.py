"""The warm-up plan notation: what it accepts, and an error naming the step and the rule for each mistake."""

from __future__ import annotations

import pytest

from fairpost.config import ConfigError, load_settings
from fairpost.config.limits import Window, parse_limits
from fairpost.config.warmup import WarmupPlan, WarmupStep, format_offset, parse_plan, stricter


def test_the_issues_example_parses_into_its_steps() -> None:
    plan = parse_plan("50/hour; 500/day from 0s | 200/hour; 2000/day from 1 day | 1000/hour from 3 days")
    assert plan == WarmupPlan(
        (
            WarmupStep(0, (Window(3600, 50), Window(86400, 500))),
            WarmupStep(86400, (Window(3600, 200), Window(86400, 2000))),
            WarmupStep(3 * 86400, (Window(3600, 1000),)),
        )
    )
    assert str(plan) == "50/hour; 500/day from 0s | 200/hour; 2000/day from 1 day | 1000/hour from 3 days"
    assert parse_plan(str(plan)) == plan


def test_none_ends_the_plan_and_every_unit_is_known() -> None:
    plan = parse_plan("5/second from 0 s | 10/second from 15s | 20/second from 2 minutes | none from 7 days")
    assert [s.offset for s in plan.steps] == [0, 15, 120, 7 * 86400]
    assert plan.steps[-1].limits is None
    assert str(plan.steps[-1]) == "none from 7 days"
    units = [
        "1s",
        "1 sec",
        "2 seconds",
        "1m",
        "3 min",
        "1 minute",
        "1h",
        "2 hrs",
        "1 hour",
        "1d",
        "2 days",
        "1w",
    ]
    for i, unit in enumerate(units):
        assert parse_plan(f"1/second from 0s | 2/second FROM {unit}").steps[1].offset > 0, (i, unit)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected at least one step"),
        ("   ", "expected at least one step"),
        ("50/hour", "step 1 ('50/hour'): expected LIMITS from OFFSET"),
        ("50/hour from", "step 1 ('50/hour from'): expected LIMITS from OFFSET"),
        ("from 0s", "step 1 ('from 0s'): expected LIMITS from OFFSET"),
        ("50/hour from 0s |", "step 2 (''): expected LIMITS from OFFSET"),
        (
            "50/hour from 0s | 100/hour from 1 fortnight",
            "step 2 ('100/hour from 1 fortnight'): unknown unit 'fortnight'",
        ),
        ("50/hour from 0s | 100/hour from 15ms", "step 2 ('100/hour from 15ms'): unknown unit 'ms'"),
        ("50/hour from 0s | 100/hour from soon", "step 2 ('100/hour from soon'): 'soon' is not an offset"),
        (
            "50/hour from 0s | 100/hour from 1.5 days",
            "step 2 ('100/hour from 1.5 days'): '1.5 days' is not an offset",
        ),
        (
            "50/hour from 0s | 100/hour from 400 days",
            "step 2 ('100/hour from 400 days'): an offset may be at most 365 days",
        ),
        ("50/hour from 0s | 100/hour from 99999999999999999999d", "an offset may be at most 365 days"),
        ("50/hour from 5s", "step 1 ('50/hour from 5s'): the first step starts at 0s, not 5s"),
        (
            "50/hour from 0s | 100/hour from 0s",
            "step 2 ('100/hour from 0s'): offsets must increase, and 0s is not after step 1's 0s",
        ),
        (
            "50/hour from 0s | 100/hour from 2 days | 200/hour from 1 day",
            "step 3 ('200/hour from 1 day'): offsets must increase, and 1 day is not after step 2's 2 days",
        ),
        ("50/fortnight from 0s", "step 1 ('50/fortnight from 0s'): '50/fortnight' is not a limit"),
        ("0/hour from 0s", "step 1 ('0/hour from 0s'): '0/hour': the count must be at least 1"),
        ("5/second; 6/second from 0s", "two limits for the same window"),
        ("none from 0s", "step 1 ('none from 0s'): the first step cannot be none"),
        (
            "5/second from 0s | none from 5s | 9/second from 9s",
            "step 2: none ends the warm-up, so it must be the last step",
        ),
    ],
)
def test_a_bad_plan_is_refused_naming_the_step_and_the_rule(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_plan(text)
    assert message in str(caught.value)


def test_the_setting_is_empty_by_default_and_names_its_variable_when_bad(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().warmup.plan is None
    monkeypatch.setenv("FAIRPOST_WARMUP__PLAN", "2/second from 0s | 5/second from 2s | none from 4s")
    settings = load_settings()
    assert settings.warmup.plan == parse_plan("2/second from 0s | 5/second from 2s | none from 4s")
    assert settings.redacted()["warmup"]["plan"] == "2/second from 0s | 5/second from 2s | none from 4s"
    assert (settings.warmup.bounce_threshold, settings.warmup.complaint_threshold) == (0.02, 0.0005)
    monkeypatch.setenv("FAIRPOST_WARMUP__PLAN", "2/second from 1s")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "FAIRPOST_WARMUP__PLAN: step 1 ('2/second from 1s'): the first step starts at 0s" in str(
        caught.value
    )
    monkeypatch.setenv("FAIRPOST_WARMUP__PLAN", "")
    monkeypatch.setenv("FAIRPOST_WARMUP__BOUNCE_THRESHOLD", "0")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "FAIRPOST_WARMUP__BOUNCE_THRESHOLD" in str(caught.value)


def test_the_stricter_of_two_limits_is_taken_window_by_window() -> None:
    own = parse_limits("10/second; 10000/day")
    step = parse_limits("50/hour; 20000/day; 5/minute")
    assert stricter(own, step) == parse_limits("10/second; 5/minute; 50/hour; 10000/day")
    assert stricter(own, parse_limits("20/second")) == own


def test_offsets_are_written_in_their_largest_unit() -> None:
    assert [format_offset(s) for s in (0, 15, 60, 90, 7200, 86400, 3 * 86400, 14 * 86400)] == [
        "0s", "15s", "1 minute", "90s", "2 hours", "1 day", "3 days", "14 days"
    ]  # fmt: skip
