"""Which release the mixed-version tests build (tests/support/release.py), read from CHANGELOG.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fairpost
from tests.support.release import ROOT, git, previous_release

HASH = "0123456789abcdef0123456789abcdef01234567"


def changelog(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "CHANGELOG.md"
    path.write_text("# Changelog\n\n## [Unreleased]\n\n" + text, encoding="utf-8")
    return path


def test_the_newest_release_that_names_its_commit_is_the_previous_one(tmp_path: Path) -> None:
    text = f"## [0.2.0] - 2027-01-01\n\nCommit: {HASH}\n\n## [0.1.0] - 2026-11-29\n\nCommit: {'f' * 40}\n"
    assert previous_release(changelog(tmp_path, text)) == ("0.2.0", HASH)


def test_a_release_being_cut_names_no_commit_yet_and_is_this_checkout(tmp_path: Path) -> None:
    text = f"## [{fairpost.__version__}] - 2026-11-29\n\n### Added\n"
    head = git("rev-parse", "HEAD").strip()
    assert previous_release(changelog(tmp_path, text)) == (fairpost.__version__, head)


def test_a_changelog_naming_no_release_commit_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="no release names its commit"):
        previous_release(changelog(tmp_path, "## [9.9.9] - 2030-01-01\n"))


def test_this_checkouts_changelog_names_this_version_and_a_commit_in_its_history() -> None:
    version, commit = previous_release()
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(fairpost.__version__)}\]", text, re.MULTILINE), version
    git("cat-file", "-e", f"{commit}^{{commit}}")
