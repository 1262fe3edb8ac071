"""Fixtures the end-to-end pool tests share (tests/support/pools.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fairpost.mailer.testing.ses_server import SesServer
from tests.support.pools import two_pools


@pytest.fixture
def eu_ses() -> Iterator[SesServer]:
    """The eu pool's own SES."""
    with SesServer() as server:
        yield server


@pytest.fixture
def pools_env(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, aws_env: str, ses: SesServer, eu_ses: SesServer
) -> dict[str, str]:
    """Two pools set up (tests/support/pools.py); the environment a daemon of both runs with."""
    two_pools(monkeypatch, redis_url, aws_env, ses, eu_ses)
    return dict(os.environ)
