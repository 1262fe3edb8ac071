"""Opt-in failover (#43): a pool's SES failing for its ``failover_after`` sends the new mail of
the tenants that name a fallback through it, and nobody else's; back when SES answers again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis

from fairpost.config import Settings, load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.daemon.aws import SES_CONFIG, session
from fairpost.mailer.daemon.failover import PoolHealth, WatchedSes
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.sdk.directory import PoolDirectory
from fairpost.mailer.testing.ses_mail import Faults
from fairpost.mailer.testing.ses_server import SesServer

REQUEST = {
    "FromEmailAddress": "app@example.com",
    "Destination": {"ToAddresses": ["ada@example.org"]},
    "Content": {"Simple": {"Subject": {"Data": "s"}, "Body": {"Text": {"Data": "t"}}}},
}


@pytest.fixture
def settings(redis_url: str) -> Settings:
    eu = {"queue_name": "fairpost-eu.fifo", "region": "eu-west-1"}
    return load_settings(redis_url=redis_url, key_prefix="fo", failover_after="60s", pools={"eu": eu})


@pytest.fixture
async def ses_client(ses_env: SesServer) -> AsyncIterator[object]:
    async with session().client("sesv2", config=SES_CONFIG) as client:
        yield client


@dataclass
class Watched:
    """The default pool's SES watched, on a clock the test turns (``now[0]``)."""

    now: list[float]
    metrics: Metrics
    health: PoolHealth
    watched: WatchedSes
    directory: PoolDirectory


@pytest.fixture
async def pool(settings: Settings, ses_client: object, redis_client: redis.Redis) -> AsyncIterator[Watched]:
    import redis.asyncio

    now = [0.0]
    metrics = Metrics()
    aclient = redis.asyncio.Redis.from_url(settings.redis_url)
    try:
        health = PoolHealth(settings, "default", aclient, ses_client, metrics, clock=lambda: now[0])
        directory = PoolDirectory(settings, redis_client, ttl=0.0)
        yield Watched(now, metrics, health, WatchedSes(ses_client, health), directory)
    finally:
        await aclient.aclose()


async def test_fallback_tenants_switch_while_the_pool_s_ses_fails_and_come_back(
    pool: Watched, ses_env: SesServer
) -> None:
    pool.directory.set_fallback("careful", "eu", verified=True)  # as `tenant fallback` writes it
    # Throttling is no outage: nothing switches, however long it lasts.
    ses_env.fail_next(1, Faults.TOO_MANY_REQUESTS)
    with pytest.raises(Exception, match="TooManyRequests"):
        await pool.watched.send_email(**REQUEST)
    pool.now[0] = 1000.0
    await pool.health.step()
    assert pool.directory.failing() == {}
    # SES's own failure (503), for less than failover_after: not yet.
    rule = ses_env.fail_when(lambda mail: True, Faults.SERVICE_UNAVAILABLE)
    with pytest.raises(Exception, match="ServiceUnavailable"):
        await pool.watched.send_email(**REQUEST)
    pool.now[0] += 59
    await pool.health.step()
    assert pool.directory.route("careful") == "default"
    # ... and past it: the fallback tenant's new mail goes to its fallback, nobody else's.
    pool.now[0] += 1
    await pool.health.step()
    assert set(pool.directory.failing()) == {"default"}
    assert pool.directory.route("careful") == "eu"
    assert pool.directory.route("anyone") == "default"
    assert pool.metrics.pools.failovers_total.labels("default", "fallback")._value.get() == 1
    # SES answers again (a GetAccount probe): back to its own pool.
    rule.cancel()
    pool.now[0] += 10
    await pool.health.step()
    assert pool.directory.failing() == {}
    assert pool.directory.route("careful") == "default"
    assert pool.metrics.pools.failovers_total.labels("default", "own")._value.get() == 1


async def test_get_account_answering_is_no_recovery_while_send_email_still_fails(
    pool: Watched, ses_env: SesServer
) -> None:
    """SES's control plane may answer while its sending fails: the probe's answer ends the
    outage only once no SendEmail has failed for ``failover_after`` (no flapping back)."""
    ses_env.fail_when(lambda mail: True, Faults.SERVICE_UNAVAILABLE)  # SendEmail only

    async def send_fails() -> None:
        with pytest.raises(Exception, match="ServiceUnavailable"):
            await pool.watched.send_email(**REQUEST)

    await send_fails()
    pool.now[0] += 60
    await pool.health.step()
    assert set(pool.directory.failing()) == {"default"}
    for _ in range(3):  # the pool's waiting mail, tried again and failing; GetAccount answers
        pool.now[0] += 10
        await send_fails()
        await pool.health.step()
        assert set(pool.directory.failing()) == {"default"}
    assert ses_env.account_requests >= 3
    # No SendEmail failed for failover_after, and GetAccount answers: back.
    pool.now[0] += 60
    await pool.health.step()
    assert pool.directory.failing() == {}
    assert pool.metrics.pools.failovers_total.labels("default", "own")._value.get() == 1


def eu_pool(monkeypatch: pytest.MonkeyPatch, redis_url: str, *, ses_url: str) -> None:
    """The CLI's environment: a second pool, eu, whose SES is at ``ses_url``."""
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_POOLS__EU__QUEUE_NAME", "fairpost-eu.fifo")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__REGION", "eu-west-1")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__SES_ENDPOINT_URL", ses_url)


def test_a_fallback_is_allowed_only_where_the_tenant_s_identities_exist(
    monkeypatch: pytest.MonkeyPatch, aws_env: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    eu_pool(monkeypatch, redis_url, ses_url=aws_env)
    monkeypatch.setenv(
        "FAIRPOST_TENANTS",
        json.dumps(
            {"known": {"default_sender": "a@known.example"}, "other": {"default_sender": "a@other.example"}}
        ),
    )
    ses = boto3.client("sesv2", region_name="eu-west-1", endpoint_url=aws_env)
    ses.create_email_identity(EmailIdentity="known.example")
    directory = PoolDirectory(load_settings(), redis.Redis.from_url(redis_url), ttl=0.0)
    assert main(["tenant", "fallback", "other", "--to", "eu"]) == 1
    err = capsys.readouterr().err
    # The identity named, and the way past the check; nothing written.
    assert "other.example" in err and "--skip-identity-check" in err
    assert directory.placement("other").fallback is None
    assert main(["tenant", "fallback", "known", "--to", "eu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "tenant": "known",
        "fallback": "eu",
        "identities_checked": True,
    }
    assert main(["tenant", "pool", "known", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    # Checked here: followed at once, without waiting for the daemon's own check.
    assert (shown["fallback"], shown["fallback_identities"]) == ("eu", "verified")
    assert main(["tenant", "fallback", "known", "--none"]) == 0
    # An operator who knows better says so explicitly: set, and said to be unchecked.
    assert main(["tenant", "fallback", "other", "--to", "eu", "--skip-identity-check"]) == 0
    assert "not checked" in capsys.readouterr().out
    assert directory.placement("other").fallback == "eu"
    # Not followed until the daemon serving eu finds its identities there (it will not).
    assert directory.placement("other").fallback_identities == "unchecked"


def test_a_fallback_whose_ses_cannot_be_asked_is_refused_unless_told_to_skip(
    monkeypatch: pytest.MonkeyPatch, aws_env: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fairpost.mailer.testing.services import free_port

    eu_pool(monkeypatch, redis_url, ses_url=f"http://127.0.0.1:{free_port()}")  # nobody answers
    monkeypatch.setenv("FAIRPOST_TENANTS", json.dumps({"known": {"default_sender": "a@known.example"}}))
    assert main(["tenant", "fallback", "known", "--to", "eu"]) == 1
    err = capsys.readouterr().err
    assert "pool eu's SES did not answer" in err and "--skip-identity-check" in err
    assert "Traceback" not in err
    assert main(["tenant", "fallback", "known", "--to", "eu", "--skip-identity-check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identities_checked"] is False
