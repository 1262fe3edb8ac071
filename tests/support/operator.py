"""What an on-call engineer has at hand, for the operator tests (tests/ops).

The ``fairpost`` CLI run in-process, daemon replicas as real processes with the
environment as it stands when they start, and the recording SES behind them.
"""

from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fairpost.mailer.cli import main
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer
from tests.support.daemon_process import DaemonProcess, daemon_process

PREFIX = "ops"
"""The key prefix the operator tests run under (not the default, so the daemon must honour it)."""


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``fairpost ARGV`` in this process: its exit code and what it printed."""
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


@dataclass(frozen=True)
class Ops:
    env: dict[str, str]
    ses: SesServer
    tmp_path: Path
    capsys: pytest.CaptureFixture[str]
    keys: MailKeys = field(default_factory=lambda: MailKeys(PREFIX))

    def daemon(self, **options: Any) -> AbstractContextManager[DaemonProcess]:
        """``fairpost run`` with ``os.environ`` as it is now, so a test's own settings apply."""
        return daemon_process(dict(os.environ), self.tmp_path, **options)

    def cli(self, *argv: str) -> tuple[int, str]:
        return run_cli(self.capsys, *argv)

    def stats(self) -> dict[str, Any]:
        code, out = self.cli("stats", "--json")
        assert code == 0
        data: dict[str, Any] = json.loads(out)
        return data
