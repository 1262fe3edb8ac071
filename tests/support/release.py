"""The previous release, built from git history into a virtualenv of its own.

CHANGELOG.md names each release's commit (``Commit: <40 hex digits>`` under its
heading). The newest release that names one is "the previous release"; while
the newest names none, it is the release being cut, this checkout's own
version, and HEAD is built (a test of the machinery until main moves on).

The build is fast and offline: ``git archive`` of the commit, then a venv
without pip whose ``.pth`` puts the release's ``src`` first and this
checkout's virtualenv's site-packages (its installed dependencies) after it.
That directory is added as a plain path, so its ``.pth`` files, among them
the editable install's ``_fairpost.pth`` that points at this checkout, are not
read: the release imports its own fairpost, and the build checks that it
does. A commit missing from the clone (a shallow CI clone) is an error, never
a skip: the mixed-version tests would test nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fairpost

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".releases"
_HEADING = re.compile(r"^## \[(\d+\.\d+\.\d+)\]", re.MULTILINE)
_COMMIT = re.compile(r"^Commit: ([0-9a-f]{40})\s*$", re.MULTILINE)

_SEND = """
import json, sys
from fairpost import MailClient
spec = json.load(sys.stdin)
with MailClient() as client:
    print(json.dumps([job for tenant, mails in spec for job in client.send_many(tenant, mails)]))
"""


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    python: str
    """The interpreter of its virtualenv: ``python -m fairpost.mailer.cli`` runs the release."""

    def send(self, env: Mapping[str, str], spec: Sequence[tuple[str, list[dict[str, Any]]]]) -> list[str]:
        """Enqueue ``spec`` (tenant, mails) with this release's SDK in a process of its own,
        as an application on that release would; the job ids."""
        done = subprocess.run(
            [self.python, "-c", _SEND], input=json.dumps(spec), env=dict(env),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"release {self.version}'s SDK failed:\n{done.stderr}"
        ids: list[str] = json.loads(done.stdout)
        return ids


def previous_release(changelog: Path = ROOT / "CHANGELOG.md") -> tuple[str, str]:
    """(version, commit) of the release the mixed-version tests run beside this checkout."""
    text = changelog.read_text(encoding="utf-8")
    headings = list(_HEADING.finditer(text))
    assert headings, f"{changelog} names no release"
    for i, heading in enumerate(headings):
        section = text[heading.end() : headings[i + 1].start() if i + 1 < len(headings) else len(text)]
        commit = _COMMIT.search(section)
        if commit:
            return heading.group(1), commit.group(1)
        if i == 0 and heading.group(1) == fairpost.__version__:
            return heading.group(1), git("rev-parse", "HEAD").strip()
    raise AssertionError(f"{changelog}: no release names its commit (Commit: <hash>)")


def build_release(version: str, commit: str) -> Release:
    """The release's virtualenv under .releases/<commit>, built once (and under a lock:
    test workers may ask together)."""
    try:
        git("cat-file", "-e", f"{commit}^{{commit}}")
    except subprocess.CalledProcessError:
        raise AssertionError(
            f"release {version}'s commit {commit} is not in this clone's history (a shallow "
            "clone?): the mixed-version tests need it; git fetch --unshallow"
        ) from None
    CACHE.mkdir(exist_ok=True)
    home = CACHE / commit
    python = home / "venv" / "bin" / "python"
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "built").exists():
            shutil.rmtree(home, ignore_errors=True)
            _build(commit, home)
    return Release(version, commit, str(python))


def _build(commit: str, home: Path) -> None:
    source, venv = home / "source", home / "venv"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    dependencies = sysconfig.get_path("purelib")
    Path(site, "_fairpost_release.pth").write_text(f"{source / 'src'}\n{dependencies}\n", encoding="utf-8")
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import fairpost; print(fairpost.__file__)"],
        capture_output=True, text=True, check=True, cwd=home,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(source)), f"the release imports {where}, not its own code"
    (home / "built").write_text(commit, encoding="utf-8")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
