"""One-click unsubscribe tried from outside (issue #42): a real ``fairpost run``, a
real ``fairpost unsubscribe-server`` process, the SDK, curl and the CLI.

A notification reaches SES with both headers; a GET on its link unsubscribes
nobody; curl's RFC 8058 POST unsubscribes at once: the next notification of
that topic to the address ends ``suppressed``, and transactional mail to it is
still sent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fairpost import MailClient
from fairpost.mailer.testing.services import die_with_parent, free_port
from fairpost.mailer.testing.wait import wait_for
from tests.support.operator import Ops

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")

KEY = "outside-test-key-0123456789abcdef0123"
BASE = "https://unsubscribe.example.com"
ADA = "ada@example.org"


@contextmanager
def unsubscribe_server(tmp_path: Path, port: int) -> Iterator[str]:
    log = (tmp_path / "unsubscribe-server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "fairpost.mailer.cli", "unsubscribe-server"],
        env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent(),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: _answers(url + "/healthz") or process.poll() is not None, within=20, what="the server"
        )
        assert process.poll() is None, (tmp_path / "unsubscribe-server.log").read_text()
        yield url
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
        log.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def curl(*args: str) -> str:
    done = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", *args],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout


def test_one_click_from_outside(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    for name, value in {
        "FAIRPOST_UNSUBSCRIBE__KEYS": f'["{KEY}"]',
        "FAIRPOST_UNSUBSCRIBE__BASE_URL": BASE,
        "FAIRPOST_UNSUBSCRIBE__HOST": "127.0.0.1",
        "FAIRPOST_UNSUBSCRIBE__PORT": str(port),
    }.items():
        monkeypatch.setenv(name, value)
    with ops.daemon(replica="u1"), unsubscribe_server(ops.tmp_path, port) as url, MailClient() as client:
        first = client.send("acme", sender="app@acme.example", to=ADA, subject="n", text="n",
                            stream="notification", topic="digest")  # fmt: skip
        wait_for(lambda: client.status(first).state == "sent", within=30, what="the first notification")
        [mail] = [m for m in ops.ses.sent if m.job_id == first]
        header = mail.header("List-Unsubscribe") or ""
        assert mail.header("List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
        link = header.split(",")[0].strip()[1:-1]
        assert link.startswith(BASE + "/u/")
        local = url + link[len(BASE) :]
        # A link scanner's GET: a page, and nobody unsubscribed.
        assert curl(local) == "200"
        code, out = ops.cli("unsubscribes", "list", "acme")
        assert code == 0 and "0 unsubscribed" in out
        # A mailbox provider's one-click POST.
        assert curl("-X", "POST", "-d", "List-Unsubscribe=One-Click", local) == "200"
        code, out = ops.cli("unsubscribes", "list", "acme")
        assert code == 0 and f"{ADA}  digest  link" in out
        # Counted in the tenant's deliverability, as `fairpost analytics` shows it.
        code, out = ops.cli("analytics", "acme", "--days", "1", "--json")
        [report] = json.loads(out)["tenants"]
        assert code == 0 and {p["provider"]: p["unsubscribed"] for p in report["providers"]} == {"other": 1}
        second = client.send("acme", sender="app@acme.example", to=ADA, subject="n", text="n",
                             stream="notification", topic="digest")  # fmt: skip
        receipt = client.send("acme", sender="app@acme.example", to=ADA, subject="r", text="r")
        wait_for(
            lambda: client.status(second).state == "suppressed", within=30, what="the second notification"
        )
        wait_for(lambda: client.status(receipt).state == "sent", within=30, what="the receipt")
    assert [m.job_id for m in ops.ses.sent] == [first, receipt]
