"""Two sending pools (#43) from outside: one ``fairpost run``, each pool with its own
SES (a recording server of its own), its own SQS queue in its own region, its own
global quota and its own Redis hash tag; tenants on each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from fairpost.config import load_settings
from fairpost.config.pools import pool_settings
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.sdk.directory import PoolDirectory
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.ses_mail import max_in_window
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.outcomes.receiver import Receiver
from tests.support.daemon_process import DaemonProcess, daemon_process
from tests.support.pools import DEFAULT_LIMIT, EU_LIMIT, PREFIX, job_ids, send


def pool_sent(daemon: DaemonProcess) -> dict[str, float]:
    """``fairpost_pool_sent_total`` by pool, on the daemon's /metrics."""
    status, text = daemon.get("/metrics")
    assert status == 200
    found = re.findall(r'^fairpost_pool_sent_total\{pool="([^"]+)"\} (\S+)$', text, re.M)
    return {pool: float(value) for pool, value in found}


def test_each_pool_sends_through_its_own_ses_within_its_own_window(
    pools_env: dict[str, str], tmp_path: Path, ses: SesServer, eu_ses: SesServer, redis_client: redis.Redis
) -> None:
    settings = load_settings()
    PoolDirectory(settings, redis_client).place("eu-tenant", "eu")
    with Receiver().running() as receiver, MailClient(settings) as client:
        # A webhook endpoint of each tenant, added once: each pool delivers its own tenants' events.
        with client.webhooks() as hooks:
            for tenant in ("us-tenant", "eu-tenant"):
                receiver.secret(f"/{tenant}", hooks.add(tenant, receiver.url(f"/{tenant}")).secret)
        jobs = {"us-tenant": send(client, "us-tenant", 12), "eu-tenant": send(client, "eu-tenant", 12)}
        eu_keys = MailKeys(pool_settings(settings, "eu").key_prefix)
        # The eu tenant's jobs live under the eu pool's hash tag, not the default's.
        assert redis_client.exists(eu_keys.queue("eu-tenant", "normal"))
        assert not redis_client.exists(MailKeys(PREFIX).queue("eu-tenant", "normal"))
        with daemon_process(pools_env, tmp_path, replica="r1", http_port=free_port()) as daemon:
            ses.wait_for(12, timeout=30)
            eu_ses.wait_for(12, timeout=30)
            # Each pool's sender counts its own: the per-tenant counters would add them up.
            wait_for(lambda: pool_sent(daemon) == {"default": 12.0, "eu": 12.0}, within=30,
                     what="each pool's fairpost_pool_sent_total")  # fmt: skip
            status, text = daemon.get("/metrics")
            for tenant, sent in jobs.items():
                wait_for(
                    lambda t=tenant, j=sent: sent_events(receiver, f"/{t}") >= set(j),  # type: ignore[misc]
                    within=30, what=f"{tenant}'s mail.sent webhooks",
                )  # fmt: skip
    assert {m.subject for m in ses.sent} == {"us-tenant"}
    assert {m.subject for m in eu_ses.sent} == {"eu-tenant"}
    # The eu pool's own global window held at its own SES.
    assert max_in_window(eu_ses.sent, 1.0) <= EU_LIMIT
    assert status == 200
    # Each pool's own global window, by pool (a bounded label: the pools configured).
    assert f'fairpost_pool_global_quota_limit{{pool="eu",window="second"}} {EU_LIMIT}.0' in text
    assert f'fairpost_pool_global_quota_limit{{pool="default",window="second"}} {DEFAULT_LIMIT}.0' in text


def sent_events(receiver: Receiver, path: str) -> set[str]:
    """The job ids of the ``mail.sent`` events delivered (and verified) at ``path``."""
    return {
        d.event["data"]["job_id"]
        for d in receiver.verified(path)
        if d.event and d.event["type"] == "mail.sent"
    }


def test_a_tenant_moved_under_load_loses_nothing_and_sends_nothing_twice(
    pools_env: dict[str, str], tmp_path: Path, ses: SesServer, eu_ses: SesServer
) -> None:
    settings = load_settings()
    total, before = 60, 20
    sent: list[str] = []
    with daemon_process(pools_env, tmp_path, replica="r1"), MailClient(settings) as client:
        sent += send(client, "mover", before)
        ses.wait_for(1, timeout=30)  # the default pool is sending the tenant's mail
        with client.pools() as pools:

            def killed(seconds: float) -> None:
                raise KeyboardInterrupt  # the command killed halfway, after the directory changed

            with pytest.raises(KeyboardInterrupt):
                pools.move("mover", "eu", sleep=killed)
            assert pools.moving("mover") is not None
            sent += send(client, "mover", 20)  # while the move stands half done
            report = pools.move("mover", "eu", wait=60)  # run again: it resumes and finishes
            assert (report.source, report.target, report.step) == ("default", "eu", "done")
            assert pools.moving("mover") is None
        after = send(client, "mover", total - len(sent))
        sent += after
        wait_for(lambda: ses.sent_count + eu_ses.sent_count >= total, within=60, what=f"{total} mails")
    ids = job_ids(ses.sent + eu_ses.sent)
    assert sorted(ids) == sorted(sent)  # every mail once: none lost, none twice
    # Mail sent after the move went through the new pool only.
    assert {m.tags["fairpost-job-id"] for m in eu_ses.sent} >= set(after)


def test_a_replica_serves_only_the_pools_it_is_told_to(
    pools_env: dict[str, str], tmp_path: Path, ses: SesServer, eu_ses: SesServer, redis_client: redis.Redis
) -> None:
    settings = load_settings()
    PoolDirectory(settings, redis_client).place("eu-tenant", "eu")
    with MailClient(settings) as client:
        send(client, "us-tenant", 3)
        send(client, "eu-tenant", 3)
    eu_keys = MailKeys(pool_settings(settings, "eu").key_prefix)
    only_eu = {**pools_env, "FAIRPOST_SERVE_POOLS": "eu"}
    with daemon_process(only_eu, tmp_path, replica="eu-only", wait_ready=False) as daemon:
        wait_for(lambda: redis_client.exists(eu_keys.heartbeat("eu-only")), within=30, what="eu's heartbeat")
        eu_ses.wait_for(3, timeout=30)
        # Its health is read where it beats: the first pool it serves.
        health = subprocess.run(
            [sys.executable, "-m", "fairpost.mailer.cli", "health", "--replica", "eu-only"],
            env={**only_eu, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}, capture_output=True, timeout=30,
        )  # fmt: skip
        assert health.returncode == 0, health.stdout + health.stderr
        assert daemon.process.poll() is None
    assert ses.sent_count == 0  # the default pool's mail waits for a replica that serves it
    assert not redis_client.exists(MailKeys(PREFIX).heartbeat("eu-only"))


def gauges(text: str, name: str) -> dict[tuple[str, str], float]:
    """(tenant, pool) → value of one per-tenant gauge on a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.labels["tenant"], s.labels.get("pool", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_per_tenant_gauges_carry_each_tenant_s_pool(
    pools_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    from fairpost.mailer.quota.admin import QuotaAdmin

    settings = load_settings()
    PoolDirectory(settings, redis_client).place("eu-tenant", "eu")
    # Paused, each in its own pool: their mail waits, so the gauges hold still.
    for tenant, pool in (("us-tenant", "default"), ("eu-tenant", "eu")):
        with QuotaAdmin(pool_settings(settings, pool)) as admin:
            admin.pause(tenant)
    with MailClient(settings) as client:
        send(client, "us-tenant", 3)
        send(client, "eu-tenant", 2)
    with daemon_process(pools_env, tmp_path, replica="r1", http_port=free_port()) as daemon:

        def backlog() -> dict[tuple[str, str], float]:
            status, text = daemon.get("/metrics")
            assert status == 200
            return gauges(text, "fairpost_backlog")

        wait_for(
            lambda: {("us-tenant", "default"): 3.0, ("eu-tenant", "eu"): 2.0}.items() <= backlog().items(),
            within=30, what="each tenant's backlog under its own pool",
        )  # fmt: skip
        _, text = daemon.get("/metrics")
    paused = gauges(text, "fairpost_tenant_paused")
    assert paused[("us-tenant", "default")] == 1.0 and paused[("eu-tenant", "eu")] == 1.0
    # Each tenant is read in the pool it is on, and nowhere else.
    assert not {("eu-tenant", "default"), ("us-tenant", "eu")} & set(gauges(text, "fairpost_backlog"))
    limits = gauges(text, "fairpost_tenant_quota_limit")
    assert {pool for _, pool in limits} == {"default", "eu"}
