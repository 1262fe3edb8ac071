"""SES's verdict on SES tenants, under faults: the task outlives any failed step, and
no verdict parks a tenant that nothing holds any more.

:class:`SesTenantStatus` runs as the daemon runs it (its task), against the recording
SES server (mailer/testing/ses_server.py: GetTenant, GetReputationEntity) over HTTP and
a real Redis.
"""

from __future__ import annotations

import asyncio
import json
import time
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio
from botocore.exceptions import EndpointConnectionError

from fairpost.config import Settings
from fairpost.mailer.cli import main
from fairpost.mailer.daemon import ses_tenant_status
from fairpost.mailer.daemon.aws import SES_CONFIG, session
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.ses_tenant_status import REASON, SesTenantStatus
from fairpost.mailer.quota.reputation import TenantVerdict
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.ses_tenancy import Status
from fairpost.mailer.testing.wait import wait_for_async as wait_for
from tests.support.pipeline import quick_settings


def ses_tenants(ses: SesServer, **statuses: Status) -> SesServer:
    """The recording SES server with each SES tenant made, SES's own verdict on it as given."""
    for name, status in statuses.items():
        ses.tenancy.create(name)
        ses.tenancy.set_aws_status(name, status)
    return ses


def _verdict(ses_tenant: str) -> str:
    verdict = TenantVerdict(ses_tenant, "DISABLED", "DISABLED", "ENABLED", None, checked_ms=1)
    return json.dumps(verdict.to_json())


class Unparks:
    """The sender's unpark, recorded; it fails the first ``failing`` times as SQS would."""

    def __init__(self, failing: int = 0) -> None:
        self.calls: list[str] = []
        self.failing = failing

    async def __call__(self, tenant: str) -> None:
        self.calls.append(tenant)
        if len(self.calls) <= self.failing:
            raise EndpointConnectionError(endpoint_url="https://sqs.us-east-1.amazonaws.com/")


@asynccontextmanager
async def status_task(
    settings: Settings, ses: SesServer, client: redis.asyncio.Redis, unpark: Unparks, metrics: Metrics
) -> AsyncIterator[tuple[SesTenantStatus, asyncio.Task[None]]]:
    """The task as the daemon runs it, asking the recording SES server over HTTP."""
    async with session().client(
        "sesv2",
        config=SES_CONFIG,
        endpoint_url=ses.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as ses_client:
        status = SesTenantStatus(
            ses_client, client, MailKeys(settings.key_prefix), settings, on_enabled=unpark, metrics=metrics
        )
        stop = asyncio.Event()
        task = asyncio.create_task(status.run(stop), name="ses-tenants")
        try:
            yield status, task
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=10)
            if not task.done():
                task.cancel()


def _alive(task: asyncio.Task[None]) -> bool:
    if task.done():
        raise AssertionError(f"the ses-tenants task died: {task.exception()!r}")
    return True


# -- defect 4: the task outlives a failed unpark ---------------------------------------------


async def test_sqs_failing_while_a_re_enabled_tenant_is_unparked_is_survived_and_the_unpark_retried(
    redis_url: str, aredis: redis.asyncio.Redis, ses: SesServer
) -> None:
    settings = quick_settings(redis_url, tenants={"acme": {"ses_tenant_name": "acme"}})
    keys = MailKeys(settings.key_prefix)
    await aredis.hset(keys.ses_tenant_status(), "acme", _verdict("acme"))  # disabled once; SES enabled it
    unpark, metrics = Unparks(failing=1), Metrics()
    async with status_task(settings, ses_tenants(ses, acme="ENABLED"), aredis, unpark, metrics) as (
        status,
        task,
    ):
        await wait_for(
            lambda: _alive(task) and unpark.calls == ["acme", "acme"],
            within=30,
            what="the unpark that failed to be tried again",
        )
        assert _alive(task) and not status.is_disabled("acme")
        assert not await aredis.hexists(keys.ses_tenant_status(), "acme")
    failed = metrics.registry.get_sample_value("fairpost_task_errors_total", {"task": "ses-tenants"})
    assert failed == 1


class Broken(Unparks):
    """An unpark with a bug: it raises what no one would think to list, every time."""

    async def __call__(self, tenant: str) -> None:
        self.calls.append(tenant)
        raise LookupError("a bug in the unpark")


async def test_any_exception_from_a_step_is_survived_and_counted(
    redis_url: str, aredis: redis.asyncio.Redis, ses: SesServer
) -> None:
    settings = quick_settings(redis_url, tenants={"acme": {"ses_tenant_name": "acme"}})
    keys = MailKeys(settings.key_prefix)
    await aredis.hset(keys.ses_tenant_status(), "acme", _verdict("acme"))
    unpark, metrics = Broken(), Metrics()
    async with status_task(settings, ses_tenants(ses, acme="ENABLED"), aredis, unpark, metrics) as (_, task):

        def failed_twice() -> bool:
            value = metrics.registry.get_sample_value("fairpost_task_errors_total", {"task": "ses-tenants"})
            return _alive(task) and (value or 0) >= 2

        await wait_for(failed_twice, within=30, what="two failed steps")
        assert _alive(task) and unpark.calls[:2] == ["acme", "acme"]


async def test_an_unreadable_ses_answer_keeps_the_last_verdict(
    redis_url: str, aredis: redis.asyncio.Redis, ses: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = quick_settings(redis_url, tenants={"acme": {"ses_tenant_name": "acme"}})
    keys = MailKeys(settings.key_prefix)
    await aredis.hset(keys.ses_tenant_status(), "acme", _verdict("acme"))
    ses_tenants(ses, acme="ENABLED")
    real_handle = ses.tenancy.handle

    def garbled(method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        # Not SES's model: the one answer the recording server would never give.
        if method == "GET" and "/reputation/entities/" in path:
            return 200, {"Unexpected": {}}
        return real_handle(method, path, body)

    monkeypatch.setattr(ses.tenancy, "handle", garbled)
    async with status_task(settings, ses, aredis, Unparks(), Metrics()) as (status, task):
        assert await status.check("acme") is None
        await wait_for(lambda: _alive(task) and status.is_disabled("acme"), within=30, what="acme parked")
        assert _alive(task) and await aredis.hexists(keys.ses_tenant_status(), "acme")


# -- defect 6: no verdict outlives what held the tenant ---------------------------------------


@pytest.mark.parametrize(
    "mapping", [{}, {"acme": {"ses_tenant_name": "acme-new"}}], ids=["mapping-removed", "mapping-changed"]
)
async def test_a_verdict_on_an_ses_tenant_the_tenant_no_longer_maps_to_is_dropped_and_the_tenant_unparked(
    redis_url: str, aredis: redis.asyncio.Redis, ses: SesServer, mapping: dict[str, Any]
) -> None:
    settings = quick_settings(redis_url, tenants=mapping)
    keys = MailKeys(settings.key_prefix)
    await aredis.hset(keys.ses_tenant_status(), "acme", _verdict("acme"))  # SES disabled "acme" once
    unpark = Unparks()
    enabled: dict[str, Status] = {"acme-new": "ENABLED"}
    ses_tenants(ses, **enabled)
    async with status_task(settings, ses, aredis, unpark, Metrics()) as (status, task):

        async def dropped() -> bool:
            return _alive(task) and not await aredis.hexists(keys.ses_tenant_status(), "acme")

        await wait_for(dropped, within=30, what="the stale verdict dropped")
        await wait_for(lambda: unpark.calls == ["acme"], within=30, what="acme unparked")
        assert not status.is_disabled("acme") and status.verdict("acme") is None


async def test_tenant_resume_lifts_a_ses_tenant_disabled_park(
    redis_url: str,
    aredis: redis.asyncio.Redis,
    ses: SesServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    settings = quick_settings(
        redis_url, tenants={"acme": {"ses_tenant_name": "acme"}}, reputation={"ses_status_refresh": 3600}
    )
    keys = MailKeys(settings.key_prefix)
    await aredis.hset(keys.ses_tenant_status(), "acme", _verdict("acme"))
    unpark = Unparks()
    async with status_task(settings, ses_tenants(ses, acme="DISABLED"), aredis, unpark, Metrics()) as (
        status,
        task,
    ):

        def parked_by_ses() -> bool:
            # Parked on SES's own answer, not only on the verdict stored before (checked_ms=1).
            verdict = status.verdict("acme")
            return _alive(task) and verdict is not None and verdict.checked_ms > 1

        await wait_for(parked_by_ses, within=30, what="acme parked on SES's verdict")
        assert await asyncio.to_thread(main, ["tenant", "resume", "acme"]) == 0
        assert capsys.readouterr().out.strip() == "tenant acme: resumed"
        assert not await aredis.hexists(keys.ses_tenant_status(), "acme")
        await wait_for(
            lambda: _alive(task) and not status.is_disabled("acme") and unpark.calls == ["acme"],
            within=30,
            what="every replica to unpark acme",
        )


def test_tenant_resume_help_names_the_holds_it_lifts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tenant", "resume", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "pause" in shown and "reputation guard" in shown and REASON in shown


# -- nothing grows with every tenant ever seen ------------------------------------------------


async def test_a_tenant_that_stopped_sending_is_forgotten(
    redis_url: str, aredis: redis.asyncio.Redis, ses: SesServer
) -> None:
    settings = quick_settings(
        redis_url, tenants={"acme": {"ses_tenant_name": "acme"}}, reputation={"ses_status_refresh": 1}
    )
    ses_tenants(ses, acme="ENABLED")
    async with status_task(settings, ses, aredis, Unparks(), Metrics()) as (status, task):
        status.waiting("acme")  # the sender asks about acme's mail once, then never again
        await wait_for(lambda: _alive(task) and "acme" in status._checked, within=30, what="acme read")
        # Read once more while it may still be waiting, then dropped: no map keeps it.
        await wait_for(
            lambda: _alive(task) and "acme" not in status._checked and "acme" not in status._waiting,
            within=20,
            what="acme forgotten once nothing waits on it",
        )


async def test_a_host_booted_moments_ago_reads_ses_at_once(
    redis_url: str, aredis: redis.asyncio.Redis, ses: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monotonic clock counts from the host's boot: on a node started a minute ago
    (a container's clock is its host's) a tenant never read must still be read now,
    not once the host has been up for the refresh interval."""
    started = time.monotonic()
    just_booted = types.SimpleNamespace(monotonic=lambda: 60.0 + time.monotonic() - started)
    monkeypatch.setattr(ses_tenant_status, "time", just_booted)
    settings = quick_settings(
        redis_url, tenants={"acme": {"ses_tenant_name": "acme"}}, reputation={"ses_status_refresh": 3600}
    )
    async with status_task(settings, ses_tenants(ses, acme="DISABLED"), aredis, Unparks(), Metrics()) as (
        status,
        task,
    ):
        status.waiting("acme")
        await wait_for(
            lambda: _alive(task) and status.is_disabled("acme"), within=30, what="acme read from SES"
        )
