"""Fixtures of the unsubscribe tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.outcomes.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver verifying every delivery with ``standardwebhooks``."""
    with Receiver().running() as running:
        yield running
