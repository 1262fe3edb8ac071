"""Fixtures of the operator tests: the environment the CLI and the daemon read, and ``ops``.

Shared ones (``redis_url``, ``aws_env``, ``ses``, ``settings``...) are in tests/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairpost.mailer.cli import main
from fairpost.mailer.testing.ses_server import SesServer
from tests.support.operator import PREFIX, Ops


@pytest.fixture
def ops_env(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, aws_env: str, ses: SesServer
) -> Iterator[dict[str, str]]:
    """FAIRPOST_* for the daemon and the CLI alike (the CLI reads os.environ); the queue exists."""
    for name, value in {
        "FAIRPOST_REDIS_URL": redis_url,
        "FAIRPOST_KEY_PREFIX": PREFIX,
        # Short polls and grace: a SIGTERMed test daemon stops in about a second.
        "FAIRPOST_SENDER__WAIT_SECONDS": "1",
        "FAIRPOST_SHUTDOWN_GRACE": "3",
        "FAIRPOST_SENDER__MAX_JITTER_SECONDS": "0",
        "AWS_ENDPOINT_URL_SESV2": ses.url,
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["init-aws"]) == 0
    yield dict(os.environ)


@pytest.fixture
def ops(ops_env: dict[str, str], ses: SesServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Ops:
    """The CLI, daemon replicas and the recording SES, on this test's Redis and moto."""
    return Ops(env=ops_env, ses=ses, tmp_path=tmp_path, capsys=capsys)
