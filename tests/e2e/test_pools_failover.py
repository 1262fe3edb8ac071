"""Failover between sending pools (#43), from outside: one ``fairpost run`` of two pools
(tests/support/pools.py). The default pool's SES fails for its side (503; not throttling):
its whole endpoint down, or SendEmail alone while GetAccount still answers. A tenant that
names ``eu`` as its fallback sends its new mail through eu's SES until the default pool's
SES sends again, then through its own again; a tenant without a fallback waits for its
own pool, and so does one whose fallback names a pool without its sender identities (the
daemon serving eu asks eu's SES, GetEmailIdentity, before any of its mail may go there).
Nothing twice, and no flapping back while SES still fails."""

from __future__ import annotations

import json
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

CAREFUL = "careful"  # names eu as its fallback, and sends from an identity eu's SES has
STRANGER = "stranger"  # names eu too, but its identity is not in eu's SES
PLAIN = "plain"  # names none
TENANTS = {CAREFUL: {"ses_identities": ["example.com"]}, STRANGER: {"ses_identities": ["stranger.example"]}}


def failovers(daemon: DaemonProcess, to: str) -> float:
    """``fairpost_pool_failovers_total{pool="default",to=...}`` on the daemon's /metrics."""
    status, text = daemon.get("/metrics")
    assert status == 200
    found = re.search(rf'^fairpost_pool_failovers_total{{pool="default",to="{to}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def fallback_checks(daemon: DaemonProcess, result: str) -> float:
    """``fairpost_pool_fallback_checks_total{pool="eu",result=...}`` on the daemon's /metrics."""
    status, text = daemon.get("/metrics")
    assert status == 200
    found = re.search(
        rf'^fairpost_pool_fallback_checks_total{{pool="eu",result="{result}"}} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def go_down(ses: SesServer, outage: str) -> None:
    if outage == "endpoint":
        ses.go_down()  # every call 503, GetAccount too
    else:
        ses.fail_when(lambda mail: True, Faults.SERVICE_UNAVAILABLE)  # SendEmail only


@pytest.mark.parametrize("outage", ["endpoint", "send_email"])
def test_a_fallback_tenant_s_mail_goes_through_the_other_pool_while_its_own_ses_is_down(
    outage: str,
    monkeypatch: pytest.MonkeyPatch,
    pools_env: dict[str, str],
    tmp_path: Path,
    ses: SesServer,
    eu_ses: SesServer,
    redis_client: redis.Redis,
) -> None:
    monkeypatch.setenv("FAIRPOST_TENANTS", json.dumps(TENANTS))
    eu_ses.verify("example.com")  # the careful tenant's identity; not the stranger's
    env = {
        **pools_env,
        "FAIRPOST_TENANTS": json.dumps(TENANTS),
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
        pools.set_fallback(CAREFUL, "eu")  # through the SDK: unchecked, for the daemon to ask
        pools.set_fallback(STRANGER, "eu")
    sent: dict[str, list[str]] = {}

    def sending(phase: str, tenant: str, n: int) -> list[str]:
        # A new client each time: none of the SDK's 2 seconds of cache from before the switch.
        with MailClient(load_settings()) as client:
            sent[f"{phase}/{tenant}"] = send(client, tenant, n)
        return sent[f"{phase}/{tenant}"]

    with daemon_process(env, tmp_path, replica="r1", http_port=free_port()) as daemon:
        # The daemon serving eu asks eu's SES about both fallbacks.
        wait_for(
            lambda: (
                [directory.placement(t).fallback_identities for t in (CAREFUL, STRANGER)]
                == ["verified", "refused"]
            ),
            within=30,
            what="the fallbacks checked",
        )
        assert fallback_checks(daemon, "verified") >= 1 and fallback_checks(daemon, "refused") >= 1
        assert daemon.logged(f"tenant {STRANGER} may not fall back to it: its identities stranger.example")
        before = sending("before", CAREFUL, 3) + sending("before", PLAIN, 3)
        ses.wait_for(6, timeout=30)  # both through their own pool while it works
        assert failovers(daemon, "fallback") == 0

        go_down(ses, outage)
        stranded = sending("down", PLAIN, 3)  # their SendEmail fails: the outage starts
        wait_for(lambda: DEFAULT_POOL in directory.failing(), within=30, what="the default pool failing")
        probes = ses.account_requests
        assert directory.route(CAREFUL) == "eu"
        assert directory.route(PLAIN) == DEFAULT_POOL
        assert directory.route(STRANGER) == DEFAULT_POOL  # its fallback refused: it waits
        moved = sending("failing", CAREFUL, 5)
        waiting = sending("failing", PLAIN, 5) + sending("failing", STRANGER, 3)
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
    assert set(eu_ids) == set(moved)  # and eu never had the other tenants' mail
    # Every mail once, across both SES accounts: none lost, none twice.
    assert Counter(own_ids + eu_ids) == Counter(job for jobs in sent.values() for job in jobs)
