"""Fixtures of the daemon's tests: the quota engine on this test's Redis.

Shared ones (``aredis``, ``ses``, ``ses_env``, ``settings``...) are in tests/conftest.py.
"""

from __future__ import annotations

import pytest
import redis.asyncio

from fairpost.mailer.quota.engine import QuotaEngine
from tests.support import KEYS


@pytest.fixture
def engine(aredis: redis.asyncio.Redis) -> QuotaEngine:
    """The engine with its default buckets; a module that counts in other buckets overrides this."""
    return QuotaEngine(aredis, KEYS)
