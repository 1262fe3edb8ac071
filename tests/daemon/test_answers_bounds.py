"""The sender forgets tenants held for their own SES fault once the hold is long over.

Pure: the map :class:`fairpost.mailer.daemon.holds.Holds` keeps, swept by the function it
calls on each hold.
"""

from __future__ import annotations

from fairpost.mailer.daemon.holds import FORGET_AFTER_SECONDS, forget_ended


def test_tenants_whose_holds_ended_long_ago_are_forgotten_and_the_rest_kept() -> None:
    now = 100_000.0
    held = {f"gone-{n}": ("ses_AccessDenied", now - FORGET_AFTER_SECONDS - 1) for n in range(1_000)}
    held["rechecking"] = ("ses_AccessDenied", now - 10)  # ended a moment ago: its next mail probes
    held["held"] = ("ses_AccessDenied", now + 30)
    next_sweep = forget_ended(held, now)
    assert set(held) == {"rechecking", "held"}
    assert next_sweep == 64  # never below the first bound: sweeps stay rare
