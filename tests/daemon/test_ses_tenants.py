"""SES tenants: provisioned by ``fairpost ses-tenants sync``, named on every send, and
SES's verdict on each obeyed (a disabled one waits alone and resumes by itself).

SES is the recording server (mailer/testing/ses_server.py), which speaks SES v2's
tenant and reputation-entity operations as botocore's model has them.
"""

from __future__ import annotations

import json
import time
from functools import partial

import boto3
import pytest
import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st

from fairpost import AsyncMailClient
from fairpost.config import Settings
from fairpost.config.ses_names import ses_tenant_name, tenant_id_of
from fairpost.mailer.cli import main
from fairpost.mailer.errors import SesTenantError
from fairpost.mailer.ops.ses_tenants import set_customer_status, sync_tenants
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async as wait_for
from tests.support.pipeline import pipeline, quick_settings

# -- names ---------------------------------------------------------------------------------


@given(st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True))
def test_the_ses_name_of_a_tenant_id_is_valid_and_maps_back(tenant_id: str) -> None:
    name = ses_tenant_name(tenant_id)
    assert name is not None
    assert all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
    assert tenant_id_of(name) == tenant_id


def test_ids_that_differ_only_by_dot_or_underscore_get_different_names() -> None:
    names = {ses_tenant_name(t) for t in ("a.b", "a_b", "a_2Eb", "a-b")}
    assert len(names) == 4
    assert ses_tenant_name("x" * 40 + "." * 10) is None  # too long once escaped


# -- sync ----------------------------------------------------------------------------------


def test_ses_tenants_sync_twice_changes_nothing_the_second_time(
    ses_env: SesServer, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tenants = {
        "acme": {
            "ses_tenant_name": "acme-prod",
            "default_sender": "no-reply@acme.example",
            "configuration_set": "cs1",
        },
        "eu.shop": {"ses_identities": ["shop.example", "billing@shop.example"]},
    }
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_SES_TENANT_NAMES", "tenant_id")
    monkeypatch.setenv("FAIRPOST_TENANTS", json.dumps(tenants))
    settings = quick_settings(redis_url, ses_tenant_names="tenant_id", tenants=tenants)

    first = sync_tenants(boto3.client("sesv2"), settings)
    assert {e.ses_tenant: (e.created, len(e.associated)) for e in first} == {
        "acme-prod": (True, 2),
        "eu_2Eshop": (True, 2),
    }
    book = ses_env.tenancy
    arns = sorted(book.tenants["acme-prod"].resources)
    assert [a.split(":", 5)[5] for a in arns] == ["configuration-set/cs1", "identity/acme.example"]
    calls = len(book.calls)

    assert main(["ses-tenants", "sync", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(not t["created"] and not t["associated"] for t in report["tenants"].values()), report
    writes = [op for op, _ in book.calls[calls:] if not op.startswith(("Get", "List"))]
    assert writes == []


def test_dry_run_reports_what_it_would_do_and_does_nothing(ses_env: SesServer, redis_url: str) -> None:
    settings = quick_settings(
        redis_url, tenants={"acme": {"ses_tenant_name": "acme", "configuration_set": "cs"}}
    )
    report = sync_tenants(boto3.client("sesv2"), settings, dry_run=True)
    assert [(e.created, len(e.associated)) for e in report] == [(True, 1)]
    assert ses_env.tenancy.tenants == {}


# -- SES's verdict -------------------------------------------------------------------------


async def test_a_tenant_disabled_by_ses_waits_alone_and_resumes_when_ses_enables_it(
    ses_env: SesServer, redis_url: str
) -> None:
    settings = quick_settings(
        redis_url,
        tenants={"acme": {"ses_tenant_name": "acme"}},
        reputation={"ses_status_refresh": 1},
        # Were the whole sender held (an account-wide pause), everyone would wait 30 s.
        sender={"wait_seconds": 1, "receivers": 1, "backoff_base_seconds": 1, "pause_seconds": 30},
    )
    ses_env.tenancy.create("acme")
    ses_env.tenancy.set_aws_status("acme", "DISABLED", "the tenant's bounce rate")
    mail = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}
    async with pipeline(settings, reputation=True), AsyncMailClient(settings) as client:
        held = [await client.send("acme", **mail) for _ in range(3)]  # type: ignore[arg-type]
        await wait_for(partial(_held, client, held[0]), within=15, what="acme's mail parked")
        started = time.monotonic()
        others = [await client.send("globex", **mail) for _ in range(3)]  # type: ignore[arg-type]
        for job in others:
            await wait_for(partial(_sent, client, job), within=10, what="globex's mail")
        assert time.monotonic() - started < 10.0  # nobody else waits for acme's SES tenant
        for job in held:
            status = await client.status(job)
            assert (status.state, status.attempts) == ("dispatched", 0), status
        async with _redis(settings) as r:
            stats = await collect_stats(r, MailKeys(settings.key_prefix), settings)
        acme = stats.tenant("acme")
        assert acme is not None and acme.held == "ses_tenant_disabled"
        assert ses_env.tenancy.calls_of("GetReputationEntity")

        ses_env.tenancy.set_aws_status("acme", "ENABLED")
        for job in held:
            await wait_for(partial(_sent, client, job), within=15, what="acme's mail after SES enabled it")
    assert {m.tenant_name for m in ses_env.sent if m.tag("fairpost-tenant") == "acme"} == {"acme"}
    assert {m.tenant_name for m in ses_env.sent if m.tag("fairpost-tenant") == "globex"} == {None}


def test_tenant_pause_ses_sets_the_customer_managed_status(
    ses_env: SesServer, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_TENANTS", json.dumps({"acme": {"ses_tenant_name": "acme"}}))
    tenant = ses_env.tenancy.create("acme")
    assert main(["tenant", "pause", "acme", "--ses"]) == 0
    assert (tenant.customer_status, tenant.aggregate) == ("DISABLED", "DISABLED")
    assert main(["tenant", "resume", "acme", "--ses"]) == 0
    assert tenant.aggregate == "ENABLED"
    # A tenant without an SES tenant: refused, naming why.
    settings = quick_settings(redis_url)
    with pytest.raises(SesTenantError, match="has no SES tenant"):
        set_customer_status(settings, "globex", enabled=False)


def _redis(settings: Settings) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(settings.redis_url)


async def _held(client: AsyncMailClient, job: str) -> bool:
    return (await client.status(job)).waiting_for == "ses_tenant_disabled"


async def _sent(client: AsyncMailClient, job: str) -> bool:
    return (await client.status(job)).state == "sent"


def test_init_aws_events_creates_the_events_queue_idempotently(
    aws_env: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    assert main(["init-aws", "--events"]) == 1  # FAIRPOST_EVENTS_QUEUE_NAME unset: refused, naming it
    assert "FAIRPOST_EVENTS_QUEUE_NAME" in capsys.readouterr().err
    monkeypatch.setenv("FAIRPOST_EVENTS_QUEUE_NAME", "fairpost-ses-events")
    for _ in range(2):
        assert main(["init-aws", "--events", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["events_queue_url"].endswith("/fairpost-ses-events")
        assert report["events_differs"] == {}
    attributes = boto3.client("sqs").get_queue_attributes(
        QueueUrl=report["events_queue_url"], AttributeNames=["FifoQueue", "MessageRetentionPeriod"]
    )["Attributes"]
    assert "FifoQueue" not in attributes and attributes["MessageRetentionPeriod"] == str(14 * 86400)
