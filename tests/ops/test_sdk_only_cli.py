"""The console script on an SDK-only install (``pip install fairpost``): commands
that need an extra say which, in one line, and exit 2; the rest work.

The real SDK-only install is tests/ops/test_packaging.py (slow); here the
daemon's modules are made unimportable in this process, as they are there.
"""

from __future__ import annotations

import sys

import pytest

from fairpost.mailer.cli import main

DAEMON_MODULES = ("boto3", "botocore", "aioboto3", "aiobotocore", "aiohttp", "prometheus_client", "rich")


@pytest.fixture
def sdk_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*DAEMON_MODULES, "moto", "matplotlib"]:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError
    for loaded in [
        m for m in sys.modules if m.startswith(("fairpost.mailer.daemon", "fairpost.mailer.demo"))
    ]:
        monkeypatch.delitem(sys.modules, loaded)


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["init-aws"], "daemon"),
        (["run"], "daemon"),
        (["demo", "--duration", "1"], "demo"),
        (["stats", "--watch"], "daemon"),
    ],
)
def test_a_command_that_needs_an_extra_died_with_module_not_found(
    sdk_only: None, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: list[str], extra: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"pip install 'fairpost[{extra}]'" in err
    assert err.startswith(f"fairpost: `fairpost {command[0]}")


def test_sdk_commands_work_without_the_daemon_extra(
    sdk_only: None, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    send = ["send", "--tenant", "acme", "--from", "a@example.com", "--to", "b@example.org"]
    assert main([*send, "--subject", "s", "--text", "t"]) == 0
    job_id = capsys.readouterr().out.strip()
    for command in (
        ["status", job_id],
        ["stats"],
        ["stats", "--json"],
        ["quota", "show"],
        ["quota", "set", "acme", "5/second"],
        ["tenant", "pause", "acme"],
        ["tenant", "resume", "acme"],
        ["dead", "list"],
        ["check-config"],
    ):
        assert main(command) == 0, command
        assert "pip install" not in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["matplotlib", "standardwebhooks"])
def test_the_demo_without_a_module_of_its_extra_names_the_extra(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    """The daemon extra installed, one of the demo's own modules not (an install made
    before the demo's webhook receiver needed ``standardwebhooks``)."""
    for loaded in [
        m for m in sys.modules if m == missing or m.startswith((missing + ".", "fairpost.mailer.demo"))
    ]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ModuleNotFoundError
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    assert main(["demo", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"fairpost: `fairpost demo` needs the demo extra ({missing} is not installed): "
        "pip install 'fairpost[demo]'\n"
    )
