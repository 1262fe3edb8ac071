"""docs/security.md names a test for each claim: every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"


def test_every_test_the_threat_model_names_exists() -> None:
    text = DOC.read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert len(named) >= 30, "the threat model names too few tests"
    missing = []
    for path, function in named:
        source = ROOT / path
        if not source.is_file():
            missing.append(path)
        elif function and not re.search(rf"^(async )?def {function}\(", source.read_text(), re.MULTILINE):
            missing.append(f"{path}::{function}")
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"


def test_it_covers_each_party_secrets_and_reporting() -> None:
    headings = re.findall(r"^## (.+)$", DOC.read_text(), re.MULTILINE)
    for wanted in ("Redis credentials", "webhook URL", "mail content", "console token", "SES's events",
                   "network", "Secrets", "Reporting a vulnerability"):  # fmt: skip
        assert any(wanted in h for h in headings), wanted
