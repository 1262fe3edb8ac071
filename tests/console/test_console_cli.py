"""``fairpost console``: its settings, the token it needs and never shows, the extra
it needs, and the real process answering and stopping on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fairpost.config import ConfigError, load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.testing.services import die_with_parent, free_port
from fairpost.mailer.testing.wait import wait_for
from tests.console.conftest import TOKEN

SECRET = "console-secret-that-must-never-show-0123"


def test_the_issue_names_of_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_CONSOLE_PORT", "9100")
    monkeypatch.setenv("FAIRPOST_CONSOLE_PREFIX", "/fairpost/")
    monkeypatch.setenv("FAIRPOST_CONSOLE_TOKEN", SECRET)
    monkeypatch.setenv("FAIRPOST_CONSOLE_WRITE", "true")
    monkeypatch.setenv("FAIRPOST_CONSOLE_SHOW_ADDRESSES", "true")
    console = load_settings().console
    assert (console.port, console.prefix, console.write, console.show_addresses) == (
        9100,
        "/fairpost",
        True,
        True,
    )
    assert console.token is not None and console.token.get_secret_value() == SECRET


def test_the_defaults() -> None:
    console = load_settings().console
    assert (console.port, console.prefix, console.token, console.write, console.show_addresses) == (
        8025, "", None, False, False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FAIRPOST_CONSOLE_PORT", "0"),
        ("FAIRPOST_CONSOLE_PORT", "web"),
        ("FAIRPOST_CONSOLE_PREFIX", "fairpost"),
        ("FAIRPOST_CONSOLE_PREFIX", "/a b"),
        ("FAIRPOST_CONSOLE_TOKEN", "short"),
        ("FAIRPOST_CONSOLE_WRITE", "perhaps"),
        ("FAIRPOST_CONSOLE_PORTT", "8025"),
    ],
)
def test_a_bad_console_setting_is_named(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert [name for name, _ in raised.value.problems] == [variable]
    assert value not in str(raised.value) or variable != "FAIRPOST_CONSOLE_TOKEN"


def test_it_will_not_start_without_a_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["console"]) == 1
    err = capsys.readouterr().err
    assert "FAIRPOST_CONSOLE_TOKEN: is required to start the console" in err


def test_check_config_never_shows_the_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_CONSOLE_TOKEN", SECRET)
    assert main(["check-config", "--json"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    assert json.loads(out)["console"]["token"] == "**********"


def test_without_the_console_extra_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_CONSOLE_TOKEN", SECRET)
    for name in [m for m in sys.modules if m.startswith("fairpost.mailer.console")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 now fails, as when not installed
    assert main(["console"]) == 2
    assert "pip install 'fairpost[console]'" in capsys.readouterr().err


def test_the_process_serves_logs_without_the_token_and_stops_on_sigterm(
    redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FAIRPOST_")},
        "FAIRPOST_REDIS_URL": redis_url,
        "FAIRPOST_CONSOLE_PORT": str(port),
        "FAIRPOST_CONSOLE_HOST": "127.0.0.1",
        "FAIRPOST_CONSOLE_TOKEN": TOKEN,
    }
    log_path = tmp_path / "console.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "fairpost.mailer.cli", "console"],
            env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(),
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _status(base + "/healthz") == 200, within=20, what="the console to answer")
        assert _status(base + "/tenants") == 302  # to the login page
        login = urllib.request.Request(base + "/login", data=b"token=wrong-token-0123456789", method="POST")
        assert _status(login) == 401
        bearer = urllib.request.Request(base + "/tenants", headers={"Authorization": f"Bearer {TOKEN}"})
        assert _status(bearer) == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    logs = log_path.read_text()
    records = [json.loads(line) for line in logs.splitlines()]
    assert any("console on http://127.0.0.1:" in r["msg"] and "read-only" in r["msg"] for r in records)
    assert any("a login with a wrong token" in r["msg"] for r in records)
    assert TOKEN not in logs and "wrong-token-0123456789" not in logs


def _status(request: str | urllib.request.Request) -> int:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError:
        return 0
