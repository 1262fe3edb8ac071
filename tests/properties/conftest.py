"""Property-based tests (hypothesis) of every parser that takes outside input.

Each runs with a fixed budget of examples: ``ci`` (the default, what ``make test``
runs) or ``fuzz`` (``make fuzz``: FAIRPOST_HYPOTHESIS_PROFILE=fuzz, many more).
No deadline: a busy machine must not fail an example for being slow; the
examples are drawn from a fixed seed in ``ci``, so a run is repeatable.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=3_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("FAIRPOST_HYPOTHESIS_PROFILE", "ci"))
