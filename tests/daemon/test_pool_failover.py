"""Opt-in failover (#43): a pool's SES failing for its ``failover_after`` sends the new mail of
the tenants that name a fallback through it, and nobody else's; back when SES answers again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

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


async def test_fallback_tenants_switch_while_the_pool_s_ses_fails_and_come_back(
    settings: Settings, ses_env: SesServer, ses_client: object, redis_client: redis.Redis
) -> None:
    import redis.asyncio

    now = [0.0]
    metrics = Metrics()
    aclient = redis.asyncio.Redis.from_url(settings.redis_url)
    try:
        health = PoolHealth(settings, "default", aclient, ses_client, metrics, clock=lambda: now[0])
        watched = WatchedSes(ses_client, health)
        directory = PoolDirectory(settings, redis_client, ttl=0.0)
        directory.set_fallback("careful", "eu")
        # Throttling is no outage: nothing switches, however long it lasts.
        ses_env.fail_next(1, Faults.TOO_MANY_REQUESTS)
        with pytest.raises(Exception, match="TooManyRequests"):
            await watched.send_email(**REQUEST)
        now[0] = 1000.0
        await health.step()
        assert directory.failing() == {}
        # SES's own failure (503), for less than failover_after: not yet.
        rule = ses_env.fail_when(lambda mail: True, Faults.SERVICE_UNAVAILABLE)
        with pytest.raises(Exception, match="ServiceUnavailable"):
            await watched.send_email(**REQUEST)
        now[0] += 59
        await health.step()
        assert directory.route("careful") == "default"
        # ... and past it: the fallback tenant's new mail goes to its fallback, nobody else's.
        now[0] += 1
        await health.step()
        assert set(directory.failing()) == {"default"}
        assert directory.route("careful") == "eu"
        assert directory.route("anyone") == "default"
        assert metrics.pools.failovers_total.labels("default", "fallback")._value.get() == 1
        # SES answers again (a GetAccount probe): back to its own pool.
        rule.cancel()
        now[0] += 10
        await health.step()
        assert directory.failing() == {}
        assert directory.route("careful") == "default"
        assert metrics.pools.failovers_total.labels("default", "own")._value.get() == 1
    finally:
        await aclient.aclose()


def test_a_fallback_is_allowed_only_where_the_tenant_s_identities_exist(
    monkeypatch: pytest.MonkeyPatch, aws_env: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_POOLS__EU__QUEUE_NAME", "fairpost-eu.fifo")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__REGION", "eu-west-1")
    monkeypatch.setenv("FAIRPOST_POOLS__EU__SES_ENDPOINT_URL", aws_env)
    monkeypatch.setenv(
        "FAIRPOST_TENANTS",
        json.dumps(
            {"known": {"default_sender": "a@known.example"}, "other": {"default_sender": "a@other.example"}}
        ),
    )
    ses = boto3.client("sesv2", region_name="eu-west-1", endpoint_url=aws_env)
    ses.create_email_identity(EmailIdentity="known.example")
    assert main(["tenant", "fallback", "other", "--to", "eu"]) == 1
    assert "other.example" in capsys.readouterr().err
    assert main(["tenant", "fallback", "known", "--to", "eu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"tenant": "known", "fallback": "eu"}
    assert main(["tenant", "pool", "known", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fallback"] == "eu"
    assert main(["tenant", "fallback", "known", "--none"]) == 0
