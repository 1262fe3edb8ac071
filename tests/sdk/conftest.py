"""Fixtures of the SDK's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fairpost.mailer.testing.wait import wait_for
from tests.support.topologies import Node, _data_node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A redis-server of this test's own, to stop and start again on its port."""
    server = _data_node(tmp_path, "redis")
    server.start()
    try:
        wait_for(server.answers, within=10, what="redis-server to answer")
        yield server
    finally:
        server.stop()
