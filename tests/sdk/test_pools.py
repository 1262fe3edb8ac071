"""Sending pools (#43) as configuration, and the SDK's routing of a tenant's mail to its pool."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from fairpost.config import ConfigError, Settings, load_settings
from fairpost.config.pools import DEFAULT_POOL, pool_names, pool_settings, served_pools
from fairpost.mailer.cli import main
from fairpost.mailer.errors import UnknownJob
from fairpost.mailer.sdk.client import AsyncMailClient, MailClient
from fairpost.mailer.sdk.directory import PoolDirectory
from fairpost.mailer.sdk.keys import MailKeys

EU_ENV = {"FAIRPOST_POOLS__EU__QUEUE_NAME": "e.fifo"}
EU = {"queue_name": "fairpost-eu.fifo", "region": "eu-west-1", "global_limits": "3/second"}


def pooled(redis_url: str, **pools: Any) -> Settings:
    return load_settings(redis_url=redis_url, key_prefix="pt", pools=pools or {"eu": EU})


def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, client: redis.Redis) -> Settings:
    """The environment of a CLI command on two pools, tenant b on eu; its settings."""
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_KEY_PREFIX", "pt")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__QUEUE_NAME", "fairpost-eu.fifo")
    settings = load_settings()
    PoolDirectory(settings, client).place("b", "eu")
    return settings


def queued(client: redis.Redis, key: str) -> list[str]:
    """The job ids a queue holds (each entry: the id, then its payload)."""
    return [str(entry).split("\n", 1)[0] for entry in client.lrange(key, 0, -1)]


def test_pools_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_POOLS__EU__REGION", "eu-west-1")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__QUEUE_NAME", "fairpost-eu.fifo")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__GLOBAL_LIMITS", "auto")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__CONFIGURATION_SET", "eu-set")
    monkeypatch.setenv("FAIRPOST_SERVE_POOLS", "eu")
    settings = load_settings()
    assert pool_names(settings) == (DEFAULT_POOL, "eu")
    assert served_pools(settings) == ("eu",)
    eu = pool_settings(settings, "eu")
    assert (eu.key_prefix, eu.queue_name) == ("fairpost:pool:eu", "fairpost-eu.fifo")
    assert eu.global_limits == "auto"
    assert eu.tenant("acme").configuration_set == "eu-set"
    # The default pool is the top-level settings, untouched.
    assert pool_settings(settings, DEFAULT_POOL) is settings
    assert MailKeys(settings.key_prefix).root == "{fairpost}"


def test_no_pools_declared_is_todays_single_pool() -> None:
    settings = load_settings()
    assert pool_names(settings) == served_pools(settings) == (DEFAULT_POOL,)
    assert settings.tenant("acme").configuration_set is None


@pytest.mark.parametrize(
    ("env", "variable", "rule"),
    [
        ({"FAIRPOST_POOLS__EU__REGION": "eu-west-1"}, "FAIRPOST_POOLS__EU", "queue_name or queue_url"),
        (
            {"FAIRPOST_POOLS__EU__QUEUE_NAME": "e.fifo", "FAIRPOST_POOLS__EU__REGION": "europe"},
            "FAIRPOST_POOLS__EU__REGION",
            "must be an AWS region",
        ),
        (
            {"FAIRPOST_POOLS__EU__QUEUE_NAME": "fairpost-mail.fifo"},
            "FAIRPOST_QUEUE_NAME, FAIRPOST_POOLS__EU__QUEUE_NAME",
            "share one SQS queue",
        ),
        (
            {"FAIRPOST_POOLS__EU__QUEUE_NAME": "e.fifo", "FAIRPOST_POOLS__EU__KEY_PREFIX": "fairpost"},
            "FAIRPOST_KEY_PREFIX, FAIRPOST_POOLS__EU__KEY_PREFIX",
            "share the key prefix",
        ),
        ({"FAIRPOST_POOLS__DEFAULT__QUEUE_NAME": "e.fifo"}, "FAIRPOST_POOLS__DEFAULT", "top-level"),
        (
            {"FAIRPOST_POOLS__EU__QUEUE_NAME": "e.fifo", "FAIRPOST_SERVE_POOLS": "us"},
            "FAIRPOST_SERVE_POOLS",
            "one of default, eu",
        ),
        (
            {**EU_ENV, "FAIRPOST_POOLS__EU__ACCESS_KEY_ID": "AKIAAAAAAAAAAAAAAAAA"},
            "FAIRPOST_POOLS__EU",
            "together",
        ),
        ({"FAIRPOST_POOLS__EU__QUEUE_NAM": "e.fifo"}, "FAIRPOST_POOLS__EU__QUEUE_NAM", "not a fairpost"),
    ],
)
def test_a_bad_pool_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], variable: str, rule: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    [(name, message)] = caught.value.problems
    assert name == variable
    assert rule in message


def test_check_config_shows_the_pools_with_secrets_masked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_POOLS__EU__QUEUE_NAME", "fairpost-eu.fifo")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__ACCESS_KEY_ID", "AKIAAAAAAAAAAAAAAAAA")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__SECRET_ACCESS_KEY", "very-secret-key")
    assert main(["check-config", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pools"]["eu"]["queue_name"] == "fairpost-eu.fifo"
    assert "very-secret-key" not in json.dumps(shown)


def test_a_tenant_s_mail_goes_to_its_pool_s_keys(redis_url: str, redis_client: redis.Redis) -> None:
    settings = pooled(redis_url)
    eu = MailKeys(pool_settings(settings, "eu").key_prefix)
    with MailClient(settings) as client:
        PoolDirectory(settings, redis_client).place("b", "eu")
        a = client.send("a", sender="x@example.com", to="ada@example.org", subject="s", text="t")
        b = client.send("b", sender="x@example.com", to="ada@example.org", subject="s", text="t")
        assert queued(redis_client, MailKeys("pt").queue("a", "normal")) == [a]
        assert queued(redis_client, eu.queue("b", "normal")) == [b]
        assert not redis_client.exists(MailKeys("pt").queue("b", "normal"), eu.queue("a", "normal"))
        # A job is found wherever it is.
        assert client.status(b).state == client.status(a).state == "queued"
        assert client.cancel(b) == "queued"
        with pytest.raises(UnknownJob):
            client.status("no-such-job")


async def test_the_async_client_routes_as_the_blocking_one(redis_url: str, redis_client: redis.Redis) -> None:
    settings = pooled(redis_url)
    PoolDirectory(settings, redis_client).place("b", "eu")
    async with AsyncMailClient(settings) as client:
        b = await client.send("b", sender="x@example.com", to="ada@example.org", subject="s", text="t")
        assert (await client.status(b)).state == "queued"
        assert await client.cancel(b) == "queued"
    eu = MailKeys(pool_settings(settings, "eu").key_prefix)
    assert redis_client.hget(eu.job(b), "state") is not None


def test_a_move_reaches_a_client_within_the_directory_ttl(redis_url: str, redis_client: redis.Redis) -> None:
    settings = pooled(redis_url)
    now = [0.0]
    reader = PoolDirectory(settings, redis_client, ttl=2.0, clock=lambda: now[0])
    writer = PoolDirectory(settings, redis_client)
    assert reader.pool_of("b") == DEFAULT_POOL
    writer.place("b", "eu")
    assert reader.pool_of("b") == DEFAULT_POOL  # cached
    now[0] = 2.0
    assert reader.pool_of("b") == "eu"
    writer.place("b", DEFAULT_POOL)
    assert writer.placements() == {}


def test_an_undeclared_pool_is_a_config_error(redis_url: str, redis_client: redis.Redis) -> None:
    settings = pooled(redis_url)
    redis_client.hset(MailKeys("pt").pool_directory(), "b", "asia")
    with pytest.raises(ConfigError, match="'asia'"), MailClient(settings) as client:
        client.send("b", sender="x@example.com", to="ada@example.org", subject="s", text="t")


def test_without_pools_the_directory_is_never_read(redis_url: str, redis_client: redis.Redis) -> None:
    settings = load_settings(redis_url=redis_url, key_prefix="pt")
    redis_client.hset(MailKeys("pt").pool_directory(), "b", "eu")  # ignored: no pool is declared
    with MailClient(settings) as client:
        b = client.send("b", sender="x@example.com", to="ada@example.org", subject="s", text="t")
    assert queued(redis_client, MailKeys("pt").queue("b", "normal")) == [b]


def test_a_move_carries_the_tenant_s_state_and_leaves_its_reputation(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = pooled(redis_url)
    old, new = MailKeys("pt"), MailKeys(pool_settings(settings, "eu").key_prefix)
    with MailClient(settings) as client:
        first = client.send("mover", sender="x@example.com", to="a@example.org", subject="s", text="t",
                            idempotency_key="order-1")  # fmt: skip
        client.suppressions().add("mover", "gone@example.org", "bounce")
        redis_client.hset(old.limit_overrides(), "t:mover", "7/minute")
        redis_client.sadd(old.paused(), "mover")
        redis_client.hset(old.warmup(), "mover", '{"step": 2}')
        redis_client.hset(old.tenant_hold("mover"), mapping={"reason": "x", "until_ms": "1"})
        redis_client.pexpire(old.tenant_hold("mover"), 60_000)
        redis_client.hset(old.reputation("mover", 86400), "b:1", "5")
        with client.pools() as pools:
            report = pools.move("mover", "eu", sleep=lambda _: None)
            assert (report.step, report.waiting) == ("draining", 1)  # its first mail waits in default
            assert pools.pool_of("mover") == "eu"
            # A retry with the same idempotency key, after the move: the first job, not a second mail.
            again = client.send("mover", sender="x@example.com", to="a@example.org", subject="s", text="t",
                                idempotency_key="order-1")  # fmt: skip
            assert again == first
            assert client.suppressions().is_suppressed("mover", "gone@example.org")
            # Added while it drains: in both pools, so the old pool's last mail is held to it too.
            client.suppressions().add("mover", "late@example.org")
            assert redis_client.hexists(old.suppressed("mover"), "late@example.org")
            client.cancel(first)  # the old pool drained
            assert pools.move("mover", "eu").step == "done"
            assert pools.move("mover", "eu").step == "done"  # idempotent
    assert redis_client.hget(new.limit_overrides(), "t:mover") == "7/minute"
    assert redis_client.sismember(new.paused(), "mover")
    assert redis_client.hget(new.warmup(), "mover") == '{"step": 2}'
    assert redis_client.hget(new.tenant_hold("mover"), "reason") == "x"
    assert 0 < redis_client.pttl(new.tenant_hold("mover")) <= 60_000
    assert redis_client.hexists(new.suppressed("mover"), "late@example.org")
    assert not redis_client.exists(new.reputation("mover", 86400))  # reputation stays where earned


def test_a_move_to_an_unknown_pool_or_while_another_stands_is_refused(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = pooled(redis_url, eu=EU, us2={"queue_name": "fairpost-us2.fifo"})
    with MailClient(settings) as client, client.pools() as pools:
        with pytest.raises(ConfigError, match="no pool 'asia'"):
            pools.move("t", "asia")
        client.send("t", sender="x@example.com", to="a@example.org", subject="s", text="t")
        assert pools.move("t", "eu", sleep=lambda _: None).step == "draining"
        with pytest.raises(ConfigError, match="finish that move first"):
            pools.move("t", "us2")


def test_the_operations_guide_documents_every_pool_setting() -> None:
    from pathlib import Path

    from fairpost.config.pools import PoolSettings

    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    for field in PoolSettings.model_fields:
        assert f"`__{field.upper()}`" in guide, field
    assert "`FAIRPOST_POOLS`" in guide and "`FAIRPOST_SERVE_POOLS`" in guide


def test_the_acl_template_names_every_pool_s_keys() -> None:
    from fairpost.mailer.ops.redis_acl import acl_setuser

    line = acl_setuser("fairpost", "fairpost", pools=["fairpost:pool:eu"])
    assert " ~{fairpost}* ~{fairpost:pool:eu}* " in line


def test_each_pool_keeps_its_own_outcome_feed(redis_url: str, redis_client: redis.Redis) -> None:
    settings = pooled(redis_url)
    PoolDirectory(settings, redis_client).place("b", "eu")
    with MailClient(settings) as client:
        job = client.send("b", sender="x@example.com", to="ada@example.org", subject="s", text="t")
        client.cancel(job)
        eu = [e.job_id for e in client.events(group="g", consumer="c", block=False, pool="eu")]
        default = [e.job_id for e in client.events(group="g", consumer="c", block=False)]
    assert job in eu
    assert job not in default


def test_commands_about_a_tenant_s_state_act_in_its_pool(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, redis_client: redis.Redis
) -> None:
    settings = cli_env(monkeypatch, redis_url, redis_client)
    eu = MailKeys(pool_settings(settings, "eu").key_prefix)
    assert main(["quota", "set", "b", "7/minute"]) == 0
    assert main(["tenant", "pause", "b"]) == 0
    assert redis_client.hget(eu.limit_overrides(), "t:b") == "7/minute"
    assert redis_client.sismember(eu.paused(), "b")
    assert not redis_client.exists(MailKeys("pt").limit_overrides(), MailKeys("pt").paused())
    # The pool's own commands stay on the directory: a move is not redirected.
    assert main(["tenant", "move", "b", "--to", "default"]) == 0
    assert PoolDirectory(settings, redis_client).placements() == {}


def test_dead_letters_and_global_quotas_of_a_pool_by_pool_option(
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = cli_env(monkeypatch, redis_url, redis_client)
    with MailClient(settings) as client:
        job = client.send("b", sender="x@example.com", to="ada@example.org", subject="s", text="t")
        client.cancel(job)  # a dead letter, in the eu pool
    assert main(["dead", "list", "--json"]) == 0
    assert job not in capsys.readouterr().out
    assert main(["dead", "list", "--pool", "eu", "--json"]) == 0
    assert job in capsys.readouterr().out
    assert main(["quota", "set", "--global", "9/second", "--pool", "eu"]) == 0
    eu = MailKeys(pool_settings(settings, "eu").key_prefix)
    assert redis_client.hget(eu.limit_overrides(), "global") == "9/second"
    assert main(["dead", "list", "--pool", "asia"]) == 1
    assert "no pool 'asia'" in capsys.readouterr().err


def test_a_move_killed_before_it_placed_the_tenant_may_go_back(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = pooled(redis_url)
    with MailClient(settings) as client, client.pools() as pools:
        pools.directory.record_move("t", {"from": "default", "to": "eu", "step": "copy"})  # killed mid-copy
        assert pools.move("t", "default").step == "done"
        assert pools.moving("t") is None and pools.pool_of("t") == "default"


def test_unsubscribes_are_kept_in_the_tenant_s_pool_and_move_with_it(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = pooled(redis_url)
    eu = MailKeys(pool_settings(settings, "eu").key_prefix)
    with MailClient(settings) as client, client.unsubscribes() as unsubscribes, client.pools() as pools:
        assert unsubscribes.add("b", "gone@example.org")
        assert redis_client.hexists(MailKeys("pt").unsubscribed("b"), "gone@example.org")
        assert pools.move("b", "eu", sleep=lambda _: None).step == "done"
        assert redis_client.hexists(eu.unsubscribed("b"), "gone@example.org")
        assert unsubscribes.add("b", "late@example.org")
        assert redis_client.hexists(eu.unsubscribed("b"), "late@example.org")
        assert [u.address for u in unsubscribes.list("b")] == ["gone@example.org", "late@example.org"]


async def test_a_one_click_unsubscribe_lands_in_the_tenant_s_pool(
    redis_url: str, redis_client: redis.Redis, aredis: redis.asyncio.Redis
) -> None:
    import time

    from fairpost.mailer.daemon.unsubscriber import Unsubscriber
    from fairpost.mailer.sdk.unsub_token import Token, sign
    from tests.unsubscribe.support import BASE, KEY

    settings = load_settings(
        redis_url=redis_url, key_prefix="pt", pools={"eu": EU}, unsubscribe={"keys": [KEY], "base_url": BASE}
    )
    PoolDirectory(settings, redis_client).place("acme", "eu")
    unsubscriber = Unsubscriber(settings, aredis)
    try:
        token = unsubscriber.token(
            sign(Token("acme", "ada@example.org", "news", int(time.time()) + 60), KEY.encode())
        )
        assert await unsubscriber.apply(token, whole_tenant=False, source="link")
    finally:
        await unsubscriber.aclose()
    eu = MailKeys(pool_settings(settings, "eu").key_prefix)
    assert redis_client.hexists(eu.unsubscribed("acme"), "ada@example.org")
    assert not redis_client.exists(MailKeys("pt").unsubscribed("acme"))


def test_stats_name_the_pool_and_read_a_tenant_s_in_its_pool(
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``fairpost stats`` says which pool it shows; a tenant asked for is read in its own."""
    with MailClient(cli_env(monkeypatch, redis_url, redis_client)) as client:
        for tenant in ("a", "b", "b"):
            client.send(tenant, sender="x@example.com", to="ada@example.org", subject="s", text="t")
    assert main(["stats", "--pool", "eu", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pool"] == "eu" and shown["tenants"]["b"]["backlog"] == 2 and "a" not in shown["tenants"]
    assert main(["stats"]) == 0
    assert capsys.readouterr().out.startswith("pool default\n")
    # A tenant asked for without --pool: read in the pool it is on.
    assert main(["stats", "--tenant", "b", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["pool"], shown["tenants"]["b"]["backlog"]) == ("eu", 2)
    assert main(["stats", "--tenant", "a", "--tenant", "b"]) == 1
    assert "a (default), b (eu)" in capsys.readouterr().err
