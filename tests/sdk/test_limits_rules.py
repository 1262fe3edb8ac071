"""A limit is a quota only if its window has a length: ``1 per 0 seconds`` is refused.

A zero-length window never refuses anything (and made the sender restamp a slow SES
call in a tight loop), so every way a limit comes in refuses it, naming the rule:
the settings (``check-config``), ``fairpost quota set``, :class:`QuotaAdmin`, and an
override written into Redis by hand (ignored, so the settings apply).
"""

from __future__ import annotations

import pytest
import redis

from fairpost.config import ConfigError, Window, load_settings, parse_limits
from fairpost.mailer.cli import main
from fairpost.mailer.errors import InvalidOverride
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.overrides import read_overrides
from fairpost.mailer.sdk.keys import MailKeys

RULE = "at least 1 second"


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("1 per 0 seconds", "1 per 0 seconds"),
        ("1/0 seconds", "1/0 seconds"),
        ("5/0 minutes", "5/0 minutes"),
        ("1/0 days", "1/0 days"),
        ("2/second; 1 per 00 hours", "1 per 00 hours"),
    ],
)
def test_a_window_of_no_length_is_refused_naming_the_part(text: str, part: str) -> None:
    with pytest.raises(ValueError, match=RULE) as info:
        parse_limits(text)
    assert repr(part) in str(info.value)


@pytest.mark.parametrize("text", ["0/second", "0 per 5 minutes"])
def test_a_count_of_zero_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="the count must be at least 1"):
        parse_limits(text)


@pytest.mark.parametrize("variable", ["FAIRPOST_TENANT_LIMITS", "FAIRPOST_GLOBAL_LIMITS"])
def test_check_config_refuses_a_zero_window(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str
) -> None:
    monkeypatch.setenv(variable, "1 per 0 seconds")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert [name for name, _ in info.value.problems] == [variable]
    assert RULE in info.value.problems[0][1]
    assert main(["check-config"]) == 1
    out, err = capsys.readouterr()
    assert variable in err and RULE in err
    assert out == ""


def test_a_tenants_own_zero_window_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_TENANTS", '{"acme": {"limits": "1 per 0 seconds"}}')
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert RULE in str(info.value)


def test_quota_set_refuses_a_zero_window(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    assert main(["quota", "set", "acme", "1 per 0 seconds"]) == 1
    assert RULE in capsys.readouterr().err
    assert main(["quota", "set", "--global", "1/0 minutes"]) == 1
    assert RULE in capsys.readouterr().err
    assert redis_client.hgetall(MailKeys(load_settings().key_prefix).limit_overrides()) == {}


def test_quota_admin_refuses_a_zero_window_as_text_or_windows(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = load_settings(redis_url=redis_url)
    with QuotaAdmin(settings) as admin:
        with pytest.raises(InvalidOverride, match=RULE):
            admin.set_tenant_limits("acme", "1 per 0 seconds")
        with pytest.raises(InvalidOverride, match=RULE):
            admin.set_tenant_limits("acme", [Window(seconds=0, limit=1)])
        with pytest.raises(InvalidOverride, match=RULE):
            admin.set_global_limits([Window(seconds=1, limit=5), Window(seconds=0, limit=1)])
    assert redis_client.hgetall(MailKeys(settings.key_prefix).limit_overrides()) == {}


def test_a_zero_window_written_into_redis_by_hand_is_ignored() -> None:
    overrides = read_overrides({"t:acme": "1/0 days", "global": "1 per 0 seconds"}, [])
    assert overrides.tenants == {}
    assert overrides.global_limits is None


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("1000000001/day", "the count may be at most 1000000000"),
        ("1" + "0" * 5000 + "/second", "the count may be at most 1000000000"),
        ("1 per " + "9" * 5000 + " seconds", "a window may be at most 7 days"),
        ("1 per 0000 seconds", RULE),
    ],
    ids=["count-over", "count-of-5000-digits", "window-of-5000-digits", "zeros"],
)
def test_absurd_numbers_are_refused_naming_the_rule(text: str, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        parse_limits(text)


def test_the_largest_count_and_a_leading_zero_still_parse() -> None:
    assert parse_limits("1000000000/day; 007/second") == (Window(1, 7), Window(86400, 1_000_000_000))
