"""The daemon's own check of fallbacks (#43): a tenant's mail fails over only to a pool whose
SES has the tenant's identities (``GetEmailIdentity``, asked by the replica serving that
pool); a fallback set through the SDK is not followed until then, and one whose identities
are missing never is. Against the recording SES (its GetEmailIdentity) and a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis
import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.mailer.daemon.aws import SES_CONFIG, session
from fairpost.mailer.daemon.fallback_checks import RETRY_SECONDS, FallbackChecks
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.sdk.directory import AsyncPoolDirectory, FallbackCheck, PoolDirectory
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer

TENANTS = {
    "known": {"default_sender": "app@known.example"},
    "other": {"default_sender": "app@other.example"},
    "several": {"ses_identities": ["known.example", "missing.example"]},
    "nameless": {},
}


@pytest.fixture
def settings(redis_url: str) -> Settings:
    eu = {"queue_name": "fairpost-eu.fifo", "region": "eu-west-1"}
    return load_settings(redis_url=redis_url, key_prefix="fc", pools={"eu": eu}, tenants=TENANTS)


@dataclass
class Checked:
    """The eu pool's checks (its SES is the recording server), on a clock the test turns."""

    now: list[float]
    metrics: Metrics
    checks: FallbackChecks
    directory: PoolDirectory
    adirectory: AsyncPoolDirectory

    def results(self, result: str) -> float:
        return float(self.metrics.pools.fallback_checks_total.labels("eu", result)._value.get())


@pytest.fixture
async def eu(
    settings: Settings, ses_env: SesServer, redis_client: redis.Redis, aredis: redis.asyncio.Redis
) -> AsyncIterator[Checked]:
    now = [1000.0]
    metrics = Metrics()
    async with session().client("sesv2", config=SES_CONFIG) as ses:
        adirectory = AsyncPoolDirectory(settings, aredis, ttl=0.0)
        checks = FallbackChecks(settings, "eu", adirectory, ses, metrics, clock=lambda: now[0])
        yield Checked(now, metrics, checks, PoolDirectory(settings, redis_client, ttl=0.0), adirectory)


def failing(redis_client: redis.Redis, pool: str) -> None:
    redis_client.hset(MailKeys("fc").pool_failing(), pool, "1")


async def test_a_fallback_set_through_the_sdk_is_followed_only_once_its_identities_are_found(
    eu: Checked, ses_env: SesServer, redis_client: redis.Redis
) -> None:
    ses_env.verify("known.example")
    for tenant in TENANTS:
        eu.directory.set_fallback(tenant, "eu")  # the SDK's way: no SES asked
    failing(redis_client, "default")
    # Unchecked: nobody's mail goes to eu yet, though their pool fails.
    assert {t: eu.directory.route(t) for t in TENANTS} == dict.fromkeys(TENANTS, "default")
    assert eu.directory.placement("known").fallback_identities == "unchecked"

    assert await eu.checks.step() == len(TENANTS)
    verdicts = {t: eu.directory.placement(t).fallback_identities for t in TENANTS}
    # Every identity must exist there; a tenant that names none cannot be checked.
    assert verdicts == {"known": "verified", "other": "refused", "several": "refused", "nameless": "refused"}
    assert {t: eu.directory.route(t) for t in TENANTS} == {
        "known": "eu", "other": "default", "several": "default", "nameless": "default",
    }  # fmt: skip
    assert eu.results("verified") == 1 and eu.results("refused") == 3
    # A verdict stands: SES is not asked again in the next rounds.
    eu.now[0] += RETRY_SECONDS
    assert await eu.checks.step() == 0


async def test_a_refused_fallback_is_asked_again_later_and_a_changed_one_starts_unchecked(
    eu: Checked, ses_env: SesServer, settings: Settings, redis_client: redis.Redis
) -> None:
    ses_env.verify("known.example")
    eu.directory.set_fallback("other", "eu")
    assert await eu.checks.step() == 1
    assert eu.directory.placement("other").fallback_identities == "refused"
    # The operator verifies the identity in eu's SES; the verdict is asked again once stale.
    ses_env.verify("other.example")
    recheck = FallbackChecks(
        settings, "eu", eu.adirectory, eu.checks._ses, eu.metrics, clock=lambda: eu.now[0], recheck_seconds=0
    )
    assert await recheck.step() == 1
    assert eu.directory.placement("other").fallback_identities == "verified"
    # Set again through the SDK: unchecked until asked again, even to the same pool.
    eu.directory.set_fallback("other", "eu")
    assert eu.directory.placement("other").fallback_identities == "unchecked"
    # A verdict on a pool the tenant no longer falls back to is not written.
    eu.directory.set_fallback("other", None)
    assert not await eu.adirectory.record_check("other", FallbackCheck("eu", True, 1))
    assert redis_client.hget(MailKeys("fc").pool_fallback_checks(), "other") is None


async def test_an_ses_that_does_not_answer_leaves_the_fallback_unchecked_and_is_asked_again_later(
    eu: Checked, ses_env: SesServer, redis_client: redis.Redis
) -> None:
    eu.directory.set_fallback("known", "eu")
    ses_env.go_down()
    assert await eu.checks.step() == 1
    assert eu.directory.placement("known").fallback_identities == "unchecked"
    assert eu.results("unanswered") == 1
    assert await eu.checks.step() == 0  # not asked about more often than RETRY_SECONDS
    ses_env.clear_faults()
    eu.now[0] += RETRY_SECONDS
    assert await eu.checks.step() == 1
    assert eu.directory.placement("known").fallback_identities == "verified"  # nothing verified: any exists
    failing(redis_client, "default")
    assert eu.directory.route("known") == "eu"
