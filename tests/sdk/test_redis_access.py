"""A Redis that refuses fairpost's credentials or a command is a configuration error,
raised at once (no retries), naming the setting and never the secret (#37)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fairpost import AsyncMailClient, ConfigError, MailClient
from fairpost.config import load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.errors import RedisAccessDenied
from fairpost.mailer.testing.services import RedisServer, redis_server

MAIL: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}
SECRET = "s3cret-pass-word"


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    """A redis-server of its own whose default user needs a password, with two ACL users:
    ``app`` (everything) and ``noscript`` (everything but running scripts)."""
    with redis_server() as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "app", "on", f">{SECRET}", "~*", "&*", "+@all"
        )
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "noscript", "on", f">{SECRET}", "~*", "&*", "+@all", "-@scripting"
        )
        admin.config_set("requirepass", SECRET)
        admin.close()
        yield server


def _url(server: RedisServer, userinfo: str) -> str:
    return f"redis://{userinfo}@127.0.0.1:{server.port}/0"


CASES = [
    pytest.param("app:wrong-password", "WRONGPASS", id="wrongpass"),
    pytest.param("", "NOAUTH", id="noauth"),
    pytest.param(f"noscript:{SECRET}", "NOPERM", id="noperm"),
]


def _assert_names_the_setting(error: BaseException, code: str) -> None:
    text = str(error)
    assert isinstance(error, ConfigError), repr(error)
    assert "FAIRPOST_REDIS_URL" in text, text
    assert code in text, text
    assert SECRET not in text and "wrong-password" not in text, text
    assert "may have been" not in text, text


@pytest.mark.parametrize(("userinfo", "code"), CASES)
def test_the_sdk_raises_access_refusals_at_once_as_configuration_errors(
    locked_redis: RedisServer, userinfo: str, code: str
) -> None:
    # A long retry window: an access refusal must not use it.
    settings = load_settings(redis_url=_url(locked_redis, userinfo), redis_retry_seconds=30)
    with MailClient(settings) as client:
        started = time.monotonic()
        with pytest.raises(RedisAccessDenied) as caught:
            client.send("acme", **MAIL)
        assert time.monotonic() - started < 2
    _assert_names_the_setting(caught.value, code)


@pytest.mark.parametrize(("userinfo", "code"), CASES)
async def test_the_async_sdk_raises_them_at_once_too(
    locked_redis: RedisServer, userinfo: str, code: str
) -> None:
    settings = load_settings(redis_url=_url(locked_redis, userinfo), redis_retry_seconds=30)
    async with AsyncMailClient(settings) as client:
        started = time.monotonic()
        with pytest.raises(RedisAccessDenied) as caught:
            await client.send("acme", **MAIL)
        assert time.monotonic() - started < 2
    _assert_names_the_setting(caught.value, code)


def test_nothing_was_written_by_a_refused_send(locked_redis: RedisServer) -> None:
    settings = load_settings(redis_url=_url(locked_redis, f"noscript:{SECRET}"), redis_retry_seconds=30)
    admin = redis.Redis(port=locked_redis.port, password=SECRET)
    admin.flushall()
    with MailClient(settings) as client, pytest.raises(RedisAccessDenied):
        client.send("acme", **MAIL)
    assert admin.dbsize() == 0
    admin.close()


@pytest.mark.parametrize(("userinfo", "code"), CASES)
def test_fairpost_send_fails_at_once_naming_the_setting(
    locked_redis: RedisServer,
    userinfo: str,
    code: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", _url(locked_redis, userinfo))
    monkeypatch.setenv("FAIRPOST_REDIS_RETRY_SECONDS", "30")
    started = time.monotonic()
    argv = ["send", "--tenant", "acme", "--from", "a@example.com", "--to", "b@example.org", "--subject", "s"]
    assert main([*argv, "--text", "t"]) == 1
    assert time.monotonic() - started < 2
    err = capsys.readouterr().err
    assert "FAIRPOST_REDIS_URL" in err and code in err, err
    assert SECRET not in err and "wrong-password" not in err and "may have been" not in err, err
