"""How long a short claim waits for company (fairpost.dispatcher.linger), on a clock the test moves."""

from __future__ import annotations

import pytest

from fairpost.dispatcher.linger import Linger


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def steady(linger: Linger, clock: Clock, per_second: int, seconds: float = 2.0) -> None:
    """Claims of one job each, ``per_second`` of them a second, for ``seconds``."""
    for _ in range(int(per_second * seconds)):
        clock.now += 1 / per_second
        linger.claimed(1)


def test_with_no_claims_seen_it_waits_the_configured_linger() -> None:
    assert Linger(0.05, clock=Clock()).seconds(9) == 0.05


def test_a_rate_that_fills_the_batch_within_twice_the_linger_is_waited_for() -> None:
    clock = Clock()
    linger = Linger(0.05, clock=clock)
    steady(linger, clock, 150)

    # 9 more at 150 a second come in 60 ms; a quarter more, so most such batches fill.
    assert linger.seconds(9) == pytest.approx(1.25 * 9 / 150, rel=0.02)
    assert 0.05 < linger.seconds(9) <= 0.1


def test_a_trickle_waits_only_the_configured_linger() -> None:
    clock = Clock()
    linger = Linger(0.05, clock=clock)
    steady(linger, clock, 16)  # the batch would take over half a second to fill

    assert linger.seconds(9) == 0.05


def test_a_rate_that_fills_the_batch_sooner_still_waits_the_configured_linger() -> None:
    clock = Clock()
    linger = Linger(0.05, clock=clock)
    steady(linger, clock, 1_000)

    assert linger.seconds(9) == 0.05


def test_the_rate_is_taken_over_the_last_second() -> None:
    clock = Clock()
    linger = Linger(0.05, clock=clock)
    steady(linger, clock, 150)
    clock.now += 5.0
    linger.claimed(0)  # an empty claim after a quiet spell

    assert linger.seconds(9) == 0.05
    steady(linger, clock, 150, seconds=1.0)
    assert linger.seconds(9) > 0.05


def test_no_linger_configured_means_none() -> None:
    clock = Clock()
    linger = Linger(0.0, clock=clock)
    steady(linger, clock, 150)

    assert linger.seconds(9) == 0.0
