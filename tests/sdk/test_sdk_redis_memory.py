"""The SDK on a Redis with maxmemory (issue 37): it refuses an evicting policy by name,
and above the high-water mark refuses new mail, retriably, writing nothing."""

from __future__ import annotations

import json

import pytest
import redis

from fairpost import AsyncMailClient, MailClient
from fairpost.config import load_settings
from fairpost.dispatcher.errors import EvictingRedis, RedisNearlyFull
from fairpost.dispatcher.redis_memory import read_memory
from fairpost.mailer.cli import main
from fairpost.mailer.testing.services import free_port
from tests.support.memory import MAXMEMORY, LimitedRedis, fill_to

MAIL = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "hi", "text": "hello"}


def test_send_refuses_allkeys_lru_naming_the_setting_and_the_fix(limited_redis_srv: LimitedRedis) -> None:
    url = limited_redis_srv.url("allkeys-lru")
    with MailClient(load_settings(redis_url=url)) as client:
        with pytest.raises(EvictingRedis) as raised:
            client.send("acme", **MAIL)  # type: ignore[arg-type]
        with pytest.raises(EvictingRedis):
            client.send_many("acme", [MAIL])
    assert "maxmemory-policy is allkeys-lru" in str(raised.value)
    assert "noeviction" in str(raised.value)
    with redis.Redis.from_url(url) as plain:
        assert plain.dbsize() == 0  # nothing was written


async def test_async_send_refuses_allkeys_lru(limited_redis_srv: LimitedRedis) -> None:
    url = limited_redis_srv.url("allkeys-lru")
    async with AsyncMailClient(load_settings(redis_url=url)) as client:
        with pytest.raises(EvictingRedis):
            await client.send("acme", **MAIL)  # type: ignore[arg-type]


def test_the_policy_is_read_once_per_client(limited_redis_srv: LimitedRedis) -> None:
    """Read on the first send and kept: a send costs no more than before. A new client
    reads it again."""
    url = limited_redis_srv.url("noeviction")
    settings = load_settings(redis_url=url)
    with MailClient(settings) as client, redis.Redis.from_url(url) as plain:
        client.send("acme", **MAIL)  # type: ignore[arg-type]
        plain.config_set("maxmemory-policy", "allkeys-lru")
        client.send("acme", **MAIL)  # type: ignore[arg-type]  # the verdict kept: not read again
        with MailClient(settings) as fresh, pytest.raises(EvictingRedis):
            fresh.send("acme", **MAIL)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["volatile-lru", "noeviction"])
def test_above_the_high_water_mark_new_mail_is_refused_retriably(
    limited_redis_srv: LimitedRedis, policy: str
) -> None:
    url = limited_redis_srv.url(policy)
    settings = load_settings(redis_url=url, redis_high_water=0.6)
    with MailClient(settings) as client, redis.Redis.from_url(url) as plain:
        client.send("acme", **MAIL)  # type: ignore[arg-type]
        before = plain.dbsize()
        fill_to(plain, 0.7)
        filled = plain.dbsize()
        with pytest.raises(RedisNearlyFull) as raised:
            client.send("acme", **MAIL)  # type: ignore[arg-type]
        with pytest.raises(RedisNearlyFull):
            client.send_many("acme", [MAIL, MAIL])
        assert plain.dbsize() == filled  # nothing was written
        assert raised.value.retriable
        assert "FAIRPOST_REDIS_HIGH_WATER=0.6" in str(raised.value)
        assert "try again" in str(raised.value)
        # Memory freed (the daemon drained, the neighbour went): mail is accepted again.
        plain.delete(*plain.keys("filler:*"))
        client.send("acme", **MAIL)  # type: ignore[arg-type]
        assert plain.dbsize() > before
        assert read_memory(plain).evicted_keys == 0


async def test_async_send_refuses_above_the_high_water_mark(limited_redis_srv: LimitedRedis) -> None:
    url = limited_redis_srv.url("volatile-lru")
    async with AsyncMailClient(load_settings(redis_url=url, redis_high_water=0.6)) as client:
        with redis.Redis.from_url(url) as plain:
            fill_to(plain, 0.7)
        with pytest.raises(RedisNearlyFull):
            await client.send("acme", **MAIL)  # type: ignore[arg-type]


def test_a_redis_without_maxmemory_takes_mail_as_before(
    client: MailClient, redis_client: redis.Redis
) -> None:
    assert read_memory(redis_client).maxmemory == 0
    client.send("acme", **MAIL)  # type: ignore[arg-type]
    assert redis_client.dbsize() > 0


@pytest.mark.parametrize(
    ("policy", "code", "said"),
    [
        ("allkeys-lru", 1, "error: Redis's maxmemory-policy is allkeys-lru"),
        ("volatile-lru", 0, "warning: maxmemory-policy volatile-lru evicts keys with a TTL"),
        ("noeviction", 0, "Redis memory: "),
    ],
)
def test_check_config_reports_the_policy(
    limited_redis_srv: LimitedRedis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    policy: str,
    code: int,
    said: str,
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", limited_redis_srv.url(policy))
    assert main(["check-config"]) == code
    assert said in capsys.readouterr().err


def test_check_config_without_redis_says_it_was_not_checked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    assert main(["check-config"]) == 0
    assert "Redis's memory and eviction policy not checked" in capsys.readouterr().err


def test_stats_show_how_full_redis_is(
    limited_redis_srv: LimitedRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = limited_redis_srv.url("volatile-lru")
    with redis.Redis.from_url(url) as plain:
        fill_to(plain, 0.5)
    monkeypatch.setenv("FAIRPOST_REDIS_URL", url)
    assert main(["stats"]) == 0
    text = capsys.readouterr().out
    assert "Redis memory: " in text and "of 4.0 MB" in text and "policy volatile-lru" in text
    assert main(["stats", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["redis_memory"]
    assert memory["maxmemory"] == MAXMEMORY and memory["policy"] == "volatile-lru"
    assert 0.5 <= memory["fill"] < 1 and memory["evicted_keys"] == 0
