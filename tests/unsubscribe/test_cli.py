"""``fairpost unsubscribes list|add|remove`` (issue #42): the operator's view of why an
address is held from a tenant's notification mail, apart from its suppression list."""

from __future__ import annotations

import json

import pytest

from fairpost import MailClient
from fairpost.config import Settings
from fairpost.mailer.cli import main
from fairpost.mailer.sdk.suppression import Suppressions


def listed(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    out = capsys.readouterr().out
    entries: list[dict[str, object]] = json.loads(out[out.index("{") :])["unsubscribed"]
    return entries


def test_unsubscribes_commands(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", settings.redis_url)
    assert main(["unsubscribes", "add", "acme", "Ada@Example.org", "--topic", "digest"]) == 0
    assert main(["unsubscribes", "add", "acme", "ada@example.org", "--topic", "comments"]) == 0
    assert main(["unsubscribes", "add", "acme", "bo@example.org"]) == 0
    capsys.readouterr()
    assert main(["unsubscribes", "list", "acme", "--json"]) == 0
    entries = listed(capsys)
    assert [(e["address"], e["topics"], e["source"]) for e in entries] == [
        ("ada@example.org", ["comments", "digest"], "admin"),
        ("bo@example.org", ["*"], "admin"),
    ]
    # Separate from the suppression list: nothing was suppressed.
    with Suppressions(settings) as lists:
        assert lists.list("acme") == []
    assert main(["unsubscribes", "remove", "acme", "ada@example.org", "--topic", "digest"]) == 0
    # One topic cannot be taken back from every topic: the rule is named, nothing changes.
    assert main(["unsubscribes", "remove", "acme", "bo@example.org", "--topic", "digest"]) == 1
    assert "remove without a topic first" in capsys.readouterr().err
    assert main(["unsubscribes", "add", "acme", "ada@example.org", "--topic", "Not A Topic"]) == 1
    assert "topic" in capsys.readouterr().err
    assert main(["unsubscribes", "list", "acme", "--json"]) == 0
    entries = listed(capsys)
    assert [(e["address"], e["topics"]) for e in entries] == [
        ("ada@example.org", ["comments"]),
        ("bo@example.org", ["*"]),
    ]
    # The application's face: the mail client's own connection.
    with MailClient(settings) as client:
        listed_now = [u.address for u in client.unsubscribes().list("acme")]
    assert listed_now == ["ada@example.org", "bo@example.org"]
    assert main(["unsubscribes", "remove", "acme", "bo@example.org"]) == 0
    assert main(["unsubscribes", "list", "acme"]) == 0
    assert "1 unsubscribed from tenant acme" in capsys.readouterr().out


def test_check_config_lists_the_unsubscribe_settings_and_masks_the_token_keys(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "s3cret-" + "k" * 40
    monkeypatch.setenv("FAIRPOST_UNSUBSCRIBE__KEYS", json.dumps([key]))
    monkeypatch.setenv("FAIRPOST_UNSUBSCRIBE__BASE_URL", "https://unsub.example.com")
    assert main(["check-config", "--json"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out[out.index("{") :])["unsubscribe"]
    assert shown["keys"] == ["**********"] and shown["base_url"] == "https://unsub.example.com"
    every = {"keys", "base_url", "mailto_domain", "token_days", "host", "port", "rate_per_minute"}
    assert set(shown) == every
    assert "s3cret" not in out
