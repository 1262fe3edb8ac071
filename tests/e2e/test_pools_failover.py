"""Failover between sending pools (#43), from outside: one ``fairpost run`` of two pools
(tests/support/pools.py). The default pool's SES fails for its side (503; not throttling):
its whole endpoint down, or SendEmail alone while GetAccount still answers. A tenant that
names ``eu`` as its fallback sends its new mail through eu's SES until the default pool's
SES sends again, then through its own again; a tenant without a fallback waits for its
own pool. Nothing twice, and no flapping back while SES still fails."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import redis

from fairpost.config import load_settings
from fairpost.config.pools import DEFAULT_POOL
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.sdk.directory import PoolDirectory
from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.daemon_process import DaemonProcess, daemon_process
from tests.support.pools import job_ids, send

pytestmark = pytest.mark.slow

CAREFUL = "careful"  # names eu as its fallback
PLAIN = "plain"  # names none


def failovers(daemon: DaemonProcess, to: str) -> float:
    """``fairpost_pool_failovers_total{pool="default",to=...}`` on the daemon's /metrics."""
    status, text = daemon.get("/metrics")
    assert status == 200
    found = re.search(rf'^fairpost_pool_failovers_total{{pool="default",to="{to}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def go_down(ses: SesServer, outage: str) -> None:
    if outage == "endpoint":
        ses.go_down()  # every call 503, GetAccount too
    else:
        ses.fail_when(lambda mail: True, Faults.SERVICE_UNAVAILABLE)  # SendEmail only


@pytest.mark.parametrize("outage", ["endpoint", "send_email"])
def test_a_fallback_tenant_s_mail_goes_through_the_other_pool_while_its_own_ses_is_down(
    outage: str,
    pools_env: dict[str, str],
    tmp_path: Path,
    ses: SesServer,
    eu_ses: SesServer,
    redis_client: redis.Redis,
) -> None:
    env = {
        **pools_env,
        "FAIRPOST_FAILOVER_AFTER": "3s",  # the default pool's own
        # Mail waiting in the failing pool is tried again every second and kept, not made a
        # dead letter after the default 5 attempts: it must still be there when SES is back.
        "FAIRPOST_SENDER__MAX_ATTEMPTS": "100",
        "FAIRPOST_SENDER__BACKOFF_BASE_SECONDS": "0.5",
        "FAIRPOST_SENDER__BACKOFF_MAX_SECONDS": "1",
    }
    settings = load_settings()
    directory = PoolDirectory(settings, redis_client, ttl=0.0)  # the test's own look, uncached
    with MailClient(settings) as client, client.pools() as pools:
        pools.set_fallback(CAREFUL, "eu")
    sent: dict[str, list[str]] = {}

    def sending(phase: str, tenant: str, n: int) -> list[str]:
        # A new client each time: none of the SDK's 2 seconds of cache from before the switch.
        with MailClient(load_settings()) as client:
            sent[f"{phase}/{tenant}"] = send(client, tenant, n)
        return sent[f"{phase}/{tenant}"]

    with daemon_process(env, tmp_path, replica="r1", http_port=free_port()) as daemon:
        before = sending("before", CAREFUL, 3) + sending("before", PLAIN, 3)
        ses.wait_for(6, timeout=30)  # both through their own pool while it works
        assert failovers(daemon, "fallback") == 0

        go_down(ses, outage)
        stranded = sending("down", PLAIN, 3)  # their SendEmail fails: the outage starts
        wait_for(lambda: DEFAULT_POOL in directory.failing(), within=30, what="the default pool failing")
        probes = ses.account_requests
        assert directory.route(CAREFUL) == "eu"
        assert directory.route(PLAIN) == DEFAULT_POOL
        moved = sending("failing", CAREFUL, 5)
        waiting = sending("failing", PLAIN, 5)
        eu_ses.wait_for(5, timeout=30)
        assert sorted(job_ids(eu_ses.sent)) == sorted(moved)  # the fallback tenant's new mail only
        assert failovers(daemon, "fallback") == 1
        assert daemon.logged("tenants with a fallback pool now send through it")
        # Still failing after a probe: no switch back, even where GetAccount answers (the
        # waiting mail's SendEmail still fails).
        wait_for(lambda: ses.account_requests > probes, within=30, what="a GetAccount probe")
        assert DEFAULT_POOL in directory.failing()
        assert failovers(daemon, "own") == 0

        ses.clear_faults()
        wait_for(lambda: not directory.failing(), within=30, what="the default pool back")
        back = sending("back", CAREFUL, 5)
        # The mail that waited in the default pool goes out there, with the new mail.
        ses.wait_for(len(before) + len(stranded) + len(waiting) + len(back), timeout=60)
        assert failovers(daemon, "own") == 1
        assert daemon.logged("SES answers again")
    own_ids, eu_ids = job_ids(ses.sent), job_ids(eu_ses.sent)
    assert set(back) <= set(own_ids)  # the fallback tenant's mail comes back to its own pool
    assert set(eu_ids) == set(moved)  # and eu never had the other tenant's mail
    # Every mail once, across both SES accounts: none lost, none twice.
    assert Counter(own_ids + eu_ids) == Counter(job for jobs in sent.values() for job in jobs)
