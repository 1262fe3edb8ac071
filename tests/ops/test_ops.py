"""Operating fairpost: live quota and tenant control, stats, metrics, health, check-config,
SES auto limits. Real daemon processes against real redis-server, moto's SQS over
HTTP and the recording SES v2 server (mailer/testing/ses_server.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fairpost.config import load_settings
from fairpost.config.limits import Window, parse_limits
from fairpost.config.sections import CONSOLE_VARIABLES, WEBHOOK_VARIABLES
from fairpost.mailer.cli import main
from fairpost.mailer.daemon.metric_labels import OTHER_TENANT, TenantLabels
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.ses_account import derive_limits
from fairpost.mailer.errors import InvalidOverride
from fairpost.mailer.ops.stats import ScopeStats, Stats, WindowUsage
from fairpost.mailer.ops.stats_render import render_table, render_text
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.operator import PREFIX, Ops, run_cli


def send(client: MailClient, tenant: str, n: int = 1, recipients: int = 1) -> list[str]:
    return [
        client.send(
            tenant,
            sender="app@example.com",
            to=[f"user{i}-{r}@example.org" for r in range(recipients)],
            subject=f"hello {i}",
            text="hi",
        )
        for i in range(n)
    ]


def sent_by(ses: SesServer, tenant: str) -> int:
    return sum(1 for m in ses.sent if m.tag("fairpost-tenant") == tenant)


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format; None if it is not exported."""
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    return None


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format: a sample not exported fails
    the test (it is not a zero)."""
    value = sample(text, name, **labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


# -- live quota control ---------------------------------------------------------------


def test_quota_set_changes_a_running_sender_within_5s(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_TENANT_LIMITS", "1/minute")
    with ops.daemon(replica="q1"), MailClient() as client:
        send(client, "acme", 4)
        ops.ses.wait_for(1, timeout=15)
        # The other three are parked in SQS until the minute frees.
        wait_for(
            lambda: (
                ops.stats()["tenants"]["acme"]["in_flight"] == 3
                and ops.stats()["tenants"]["acme"]["retry_after_seconds"] > 30
            ),
            within=15,
            what="acme's mail to be parked by its quota",
        )
        assert sent_by(ops.ses, "acme") == 1

        code, out = ops.cli("quota", "set", "acme", "100/minute; 5000/day")
        assert code == 0 and "100/minute; 5000/day" in out
        ops.ses.wait_for(4, timeout=5)

        code, out = ops.cli("quota", "show", "acme", "--json")
        shown = json.loads(out)
        assert shown["tenants"]["acme"]["limits"] == "100/minute; 5000/day"
        assert shown["tenants"]["acme"]["source"] == "override"

        # Lowering works the same way: the next mail waits for the new limit.
        code, _ = ops.cli("quota", "set", "acme", "4/minute")
        assert code == 0
        wait_for(
            lambda: ops.stats()["tenants"]["acme"]["limits"] == "4/minute",
            within=5,
            what="stats to show the override",
        )

        code, out = ops.cli("quota", "reset", "acme")
        assert code == 0 and "back to the settings" in out
        shown = json.loads(ops.cli("quota", "show", "acme", "--json")[1])
        assert shown["tenants"]["acme"]["limits"] == "1/minute"
        assert shown["tenants"]["acme"]["source"] == "settings"


def test_global_quota_set_wakes_a_sender_held_by_the_global_quota(
    ops: Ops, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "1/minute")
    with ops.daemon(replica="g1"), MailClient() as client:
        send(client, "acme", 1)
        ops.ses.wait_for(1, timeout=15)
        send(client, "beta", 2)
        wait_for(
            lambda: ops.stats()["global"]["retry_after_seconds"] > 30,
            within=10,
            what="the global quota to be spent",
        )
        code, _ = ops.cli("quota", "set", "--global", "50/second")
        assert code == 0
        ops.ses.wait_for(3, timeout=5)
        assert sent_by(ops.ses, "beta") == 2
        shown = json.loads(ops.cli("quota", "show", "--json")[1])
        assert shown["global"] == {
            "scope": "global",
            "limits": "50/second",
            "windows": [[1, 50]],
            "source": "override",
            "paused": False,
        }
        assert ops.cli("quota", "reset", "--global")[0] == 0
        shown = json.loads(ops.cli("quota", "show", "--json")[1])
        assert shown["global"]["limits"] == "1/minute"


def test_pause_and_resume_a_tenant(ops: Ops) -> None:
    with ops.daemon(replica="p1"), MailClient() as client:
        code, out = ops.cli("tenant", "pause", "acme")
        assert code == 0 and "paused" in out
        send(client, "acme", 3)
        send(client, "beta", 2)
        # beta flows while acme waits in its queue.
        ops.ses.wait_for(2, timeout=15)
        assert sent_by(ops.ses, "beta") == 2
        data = ops.stats()["tenants"]["acme"]
        assert data["paused"] is True
        assert data["backlog"] == 3
        assert sent_by(ops.ses, "acme") == 0

        code, _ = ops.cli("tenant", "resume", "acme")
        assert code == 0
        ops.ses.wait_for(5, timeout=5)
        assert sent_by(ops.ses, "acme") == 3
        assert ops.stats()["tenants"]["acme"]["paused"] is False


def test_pause_holds_mail_already_in_sqs_and_resume_releases_it(
    ops: Ops, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dispatcher only: the mail reaches SQS, nothing sends it yet.
    with ops.daemon(replica="d1", role="dispatcher") as d1, MailClient() as client:
        job_ids = send(client, "acme", 2)
        # Handed to SQS, not only claimed: a claim cut off by the stop would wait out its lease.
        wait_for(
            lambda: all(client.status(j).state == "dispatched" for j in job_ids),
            within=15,
            what="acme's mail to reach SQS",
        )
        assert d1.stop() == 0
    assert ops.cli("tenant", "pause", "acme")[0] == 0
    with ops.daemon(replica="s1", role="sender") as sender:
        wait_for(
            lambda: sender.logged("tenant over quota (paused)"),
            within=15,
            what="the sender to park the paused tenant's mail",
        )
        assert sent_by(ops.ses, "acme") == 0
        assert ops.cli("tenant", "resume", "acme")[0] == 0
        ops.ses.wait_for(2, timeout=10)


def test_quota_admin_validates_before_writing(ops: Ops, redis_client: redis.Redis) -> None:
    with QuotaAdmin() as admin:
        with pytest.raises(InvalidOverride, match="limits"):
            admin.set_tenant_limits("acme", "lots/minute")
        with pytest.raises(InvalidOverride, match="tenant"):
            admin.set_tenant_limits("no spaces", "1/second")
        assert redis_client.hgetall(ops.keys.limit_overrides()) == {}
        assert admin.set_tenant_limits("acme", [Window(60, 10), Window(1, 2)]) == parse_limits(
            "2/second; 10/minute"
        )
        assert admin.pause("acme") is True
        assert admin.pause("acme") is False
        assert admin.paused() == ["acme"]
        assert [e.scope for e in admin.show()] == ["global", "acme"]
        assert admin.resume("acme") is True
        assert admin.resume("acme") is False
        assert admin.reset_tenant_limits("acme") is True
        assert admin.reset_tenant_limits("acme") is False


def test_quota_cli_usage_errors(ops: Ops, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quota", "set", "acme"]) == 2
    assert main(["quota", "set", "--global", "acme", "1/second"]) == 2
    assert main(["quota", "reset"]) == 2
    assert main(["quota", "set", "acme", "often"]) == 1
    assert "limits: 'often' is not a limit" in capsys.readouterr().err


# -- stats ------------------------------------------------------------------------------


def test_stats_json_for_a_known_load(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    # acme: 2 recipients a minute, 2 mails in SQS at most; 7 mails of 1 recipient.
    # Steady state: 2 sent, 2 parked in SQS (in flight), 3 waiting in Redis.
    monkeypatch.setenv("FAIRPOST_TENANTS", '{"acme": {"limits": "2/minute; 100/day", "inflight_cap": 2}}')
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "10/second; 1000/day")
    with ops.daemon(replica="st1"), MailClient() as client:
        send(client, "acme", 7)
        send(client, "beta", 1, recipients=3)
        ops.ses.wait_for(3, timeout=15)

        def steady() -> bool:
            acme = ops.stats()["tenants"]["acme"]
            return bool(acme["backlog"] == 3 and acme["in_flight"] == 2 and acme["retry_after_seconds"] > 0)

        wait_for(steady, within=15, what="acme's steady state")
        data = ops.stats()
        acme, beta, glob = data["tenants"]["acme"], data["tenants"]["beta"], data["global"]
        assert [(w["window"], w["used"], w["limit"]) for w in acme["windows"]] == [
            ("minute", 2, 2),
            ("day", 2, 100),
        ]
        assert acme["limits"] == "2/minute; 100/day"
        assert acme["throttled_until_ms"] > data["at_ms"]
        assert (beta["backlog"], beta["in_flight"]) == (0, 0)
        assert [(w["window"], w["used"]) for w in beta["windows"]][1] == ("day", 3)
        assert acme["limits_source"] == "tenant settings" and beta["limits_source"] == "settings"
        assert glob["backlog"] == 3 and glob["in_flight"] == 2
        assert [(w["window"], w["used"], w["limit"]) for w in glob["windows"]][1] == ("day", 5, 1000)
        assert data["replicas"] == ["st1"]

        code, out = ops.cli("stats")
        assert code == 0
        assert re.search(r"^acme\s+3\s+2\s+2/2 per minute, 2/100 per day\s+throttled", out, re.M), out
        assert "replicas alive: 1 (st1)" in out

        code, out = ops.cli("stats", "--json", "--tenant", "beta")
        assert list(json.loads(out)["tenants"]) == ["beta"]


def test_stats_without_redis_fails_cleanly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    assert main(["stats"]) == 1
    err = capsys.readouterr().err
    assert "cannot use Redis at redis://:***@127.0.0.1" in err
    assert "hunter2" not in err


# -- metrics and health -----------------------------------------------------------------

DOCUMENTED_METRICS = (
    "fairpost_deliverability_total",
    "fairpost_deliverability_tenant_total",
    "fairpost_mail_dispatched_total",
    "fairpost_mail_sent_total",
    "fairpost_mail_throttled_total",
    "fairpost_mail_retried_total",
    "fairpost_mail_dead_total",
    "fairpost_mail_dropped_total",
    "fairpost_jobs_reconciled_total",
    "fairpost_ses_calls_total",
    "fairpost_sqs_receives_total",
    "fairpost_sqs_handed_back_total",
    "fairpost_newer_format_total",
    "fairpost_pool_failovers_total",
    "fairpost_pool_fallback_checks_total",
    "fairpost_pool_sent_total",
    "fairpost_pool_dead_total",
    "fairpost_pool_throttled_total",
    "fairpost_pool_backlog",
    "fairpost_pool_inflight",
    "fairpost_pool_global_quota_used",
    "fairpost_pool_global_quota_limit",
    "fairpost_mail_latency_seconds",
    "fairpost_ses_call_seconds",
    "fairpost_backlog",
    "fairpost_inflight",
    "fairpost_tenant_quota_used",
    "fairpost_tenant_quota_limit",
    "fairpost_global_quota_used",
    "fairpost_global_quota_limit",
    "fairpost_tenant_paused",
    "fairpost_tenant_retry_after_seconds",
    "fairpost_global_retry_after_seconds",
    "fairpost_replicas",
    "fairpost_redis_used_memory_bytes",
    "fairpost_redis_maxmemory_bytes",
    "fairpost_redis_evicted_keys",
    "fairpost_redis_maxmemory_policy",
    "fairpost_redis_high_water_ratio",
    "fairpost_stats_errors_total",
    "fairpost_task_errors_total",
    "fairpost_ses_events_total",
    "fairpost_mail_suppressed_total",
    "fairpost_reputation_guard_actions_total",
    "fairpost_tenant_bounce_rate",
    "fairpost_tenant_complaint_rate",
    "fairpost_tenant_held",
    "fairpost_tenant_warmup_step",
    "fairpost_tenant_warmup_held",
    "fairpost_webhook_attempts_total",
    "fairpost_webhook_deliveries_total",
    "fairpost_webhook_endpoints_disabled_total",
    "fairpost_webhook_attempt_seconds",
    "fairpost_webhook_pending",
    "fairpost_webhook_oldest_pending_seconds",
    "fairpost_webhook_endpoints",
)


def test_metrics_healthz_readyz_and_health_command(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    with ops.daemon(replica="m1", http_port=port) as daemon, MailClient() as client:
        status, before = daemon.get("/metrics")
        assert status == 200
        families = set(re.findall(r"^# TYPE (fairpost_\w+) ", before, re.M))
        assert families == set(DOCUMENTED_METRICS)
        # A tenant's series appears with its first mail; the call results are there from the start.
        assert sample(before, "fairpost_mail_sent_total", tenant="acme") is None
        assert metric(before, "fairpost_ses_calls_total", result="sent") == 0

        send(client, "acme", 3, recipients=2)
        send(client, "beta", 1)
        ops.ses.wait_for(4, timeout=15)
        wait_for(
            lambda: metric(daemon.get("/metrics")[1], "fairpost_mail_sent_total", tenant="acme") == 3,
            within=5,
            what="the sent counter",
        )
        text = daemon.get("/metrics")[1]
        assert metric(text, "fairpost_mail_dispatched_total", tenant="acme") == 3
        assert metric(text, "fairpost_mail_sent_total", tenant="beta") == 1
        assert metric(text, "fairpost_ses_calls_total", result="sent") == 4
        assert metric(text, "fairpost_ses_call_seconds_count") == 4
        assert metric(text, "fairpost_mail_latency_seconds_count") == 4
        # Its six recipients, or what of them is still in the last second.
        assert (
            0
            <= metric(text, "fairpost_tenant_quota_used", tenant="acme", pool="default", window="second")
            <= 6
        )
        assert metric(text, "fairpost_tenant_quota_used", tenant="acme", pool="default", window="day") == 6
        assert (
            metric(text, "fairpost_tenant_quota_limit", tenant="acme", pool="default", window="day") == 10_000
        )
        assert metric(text, "fairpost_global_quota_used", window="day") == 7
        assert metric(text, "fairpost_backlog", tenant="acme", pool="default") == 0
        assert metric(text, "fairpost_replicas") == 1
        assert "process_resident_memory_bytes" in text

        assert daemon.get("/healthz") == (
            200,
            "ok: running: dispatcher, heartbeat, http, overrides, reconciler, redis-memory, sender, slots, "
            "webhook-fanout, webhooks\n",
        )
        assert daemon.get("/readyz") == (200, "ok: Redis and SQS answer\n")
        assert daemon.get("/nope")[0] == 404

        # fairpost health asks /healthz when FAIRPOST_HTTP_PORT is set, as in the image.
        monkeypatch.setenv("FAIRPOST_HTTP_PORT", str(port))
        assert ops.cli("health")[0] == 0
        code, out = ops.cli("health", "--json")
        assert code == 0 and json.loads(out)["ok"] is True
        # ... and the heartbeat in Redis when asked for a replica.
        code, out = ops.cli("health", "--replica", "m1", "--json")
        assert code == 0 and json.loads(out)["heartbeat"]["replica"] == "m1"

        assert daemon.stop() == 0
    assert ops.cli("health")[0] == 1
    # A clean stop removes the heartbeat at once.
    code, out = ops.cli("health", "--replica", "m1")
    assert code == 1 and "no heartbeat" in out


def test_health_by_heartbeat_without_http(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_REPLICA_ID", "hb1")
    assert ops.cli("health")[0] == 1
    with ops.daemon(replica="hb1") as daemon:
        code, out = ops.cli("health")
        assert code == 0, out
        assert out.startswith("healthy: replica 'hb1' beat")
        assert daemon.stop() == 0
    assert ops.cli("health")[0] == 1


def test_the_documented_metrics_are_the_registered_ones() -> None:
    registered = {family.name for family in Metrics().registry.collect()}
    assert registered == {name.removesuffix("_total") for name in DOCUMENTED_METRICS}


def test_tenant_labels_are_bounded() -> None:
    labels = TenantLabels(configured=["vip"], limit=2)
    assert [labels(t) for t in ("a", "b", "c", "vip", "a", "d")] == [
        "a",
        "b",
        OTHER_TENANT,
        "vip",
        "a",
        OTHER_TENANT,
    ]
    metrics = Metrics(TenantLabels(limit=1))
    metrics.update(
        Stats(
            at_ms=0,
            global_=ScopeStats("global", 7, 0, [WindowUsage(1, 5, 2)], "settings"),
            tenants=[
                ScopeStats("a", 3, 0, [WindowUsage(1, 5, 1)], "settings"),
                ScopeStats("b", 2, 0, [WindowUsage(1, 5, 1)], "settings"),
                ScopeStats("c", 2, 0, [WindowUsage(1, 5, 0)], "settings"),
            ],
        )
    )
    text = metrics.render().decode()
    assert metric(text, "fairpost_backlog", tenant="a", pool="default") == 3
    assert metric(text, "fairpost_backlog", tenant=OTHER_TENANT, pool="default") == 4
    assert 'tenant="b"' not in text
    assert metric(text, "fairpost_global_quota_used", window="second") == 2


def test_per_tenant_gauges_are_by_pool_and_a_tenant_gone_from_a_pool_loses_its_series() -> None:
    """Each served pool's tenants under its own ``pool`` label (#43); a tenant a pool no
    longer holds (moved away, drained) is dropped from it, not left at its last value."""

    def stats(backlog: int, *tenants: tuple[str, int]) -> Stats:
        return Stats(
            at_ms=0,
            global_=ScopeStats("global", backlog, 0, [], "settings"),
            tenants=[
                ScopeStats(t, n, 0, [WindowUsage(1, 5, 0)], "settings", paused=True) for t, n in tenants
            ],
        )

    metrics = Metrics(TenantLabels(configured=["a", "b"]))
    metrics.update(stats(3, ("a", 3)), "default")
    metrics.update(stats(4, ("a", 1), ("b", 3)), "eu", global_=False)
    text = metrics.render().decode()
    assert metric(text, "fairpost_backlog", tenant="a", pool="default") == 3
    assert metric(text, "fairpost_backlog", tenant="a", pool="eu") == 1
    assert metric(text, "fairpost_tenant_paused", tenant="b", pool="eu") == 1
    assert sample(text, "fairpost_backlog", tenant="b", pool="default") is None
    # a drained from eu: its eu series go, b's and default's stay.
    metrics.update(stats(3, ("b", 3)), "eu", global_=False)
    text = metrics.render().decode()
    assert sample(text, "fairpost_backlog", tenant="a", pool="eu") is None
    assert sample(text, "fairpost_tenant_quota_used", tenant="a", pool="eu", window="second") is None
    assert metric(text, "fairpost_tenant_paused", tenant="a", pool="default") == 1
    assert metric(text, "fairpost_backlog", tenant="b", pool="eu") == 3


# -- check-config -----------------------------------------------------------------------


def test_check_config_masks_secrets_and_names_the_bad_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", "redis://app:s3cret@redis.internal:6379/0")
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "auto")
    code, out = run_cli(capsys, "check-config", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["redis_url"] == "redis://app:***@redis.internal:6379/0"
    assert data["global_limits"] == "auto"
    assert "s3cret" not in out

    monkeypatch.setenv("FAIRPOST_SES_SAFETY_FACTOR", "1.5")
    monkeypatch.setenv("FAIRPOST_SHUTDOWN_GRACE", "soon")
    code = main(["check-config"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "FAIRPOST_SES_SAFETY_FACTOR: Input should be less than or equal to 1" in err
    assert "FAIRPOST_SHUTDOWN_GRACE" in err
    assert "s3cret" not in err + out


# -- limits from SES ----------------------------------------------------------------------


def test_derive_limits_from_the_send_quota() -> None:
    quota = {"MaxSendRate": 14.0, "Max24HourSend": 50_000.0, "SentLast24Hours": 1_000.0}
    assert derive_limits(quota, 0.9) == parse_limits("12/second; 44000/day")
    # What fairpost itself sent is already in its own day window: only others' sends count.
    assert derive_limits(quota, 0.9, own_last_24h=1_000) == parse_limits("12/second; 45000/day")
    assert derive_limits({"MaxSendRate": 1.0, "Max24HourSend": 200.0}, 0.5) == parse_limits(
        "1/second; 100/day"
    )
    assert derive_limits({"MaxSendRate": 10.0, "Max24HourSend": -1.0}, 1.0) == parse_limits("10/second")


def test_auto_global_limits_follow_the_ses_account(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    ops.ses.set_quota(max_send_rate=10, max_24_hour_send=1000, sent_last_24_hours=100)
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "auto")
    monkeypatch.setenv("FAIRPOST_SES_SAFETY_FACTOR", "0.5")
    monkeypatch.setenv("FAIRPOST_SES_ACCOUNT_REFRESH", "1")
    with ops.daemon(replica="a1") as daemon, MailClient() as client:
        shown = json.loads(ops.cli("quota", "show", "--json")[1])
        assert shown["global"]["limits"] == "5/second; 400/day"
        assert shown["global"]["source"] == "auto"
        send(client, "acme", 2)
        ops.ses.wait_for(2, timeout=15)

        ops.ses.set_quota(max_send_rate=20)
        wait_for(
            lambda: (
                json.loads(ops.cli("quota", "show", "--json")[1])["global"]["limits"] == "10/second; 400/day"
            ),
            within=10,
            what="the new SES quota to be read",
        )
        assert daemon.logged("global limits from SES: 10/second; 400/day")
        assert ops.stats()["global"]["limits_source"] == "auto"


def test_auto_global_limits_need_get_account(
    ops: Ops, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # moto's SES v2 has no GetAccount: the sender refuses to start without limits.
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", ops.env["AWS_ENDPOINT_URL"])
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "auto")
    code = main(["run", "--role", "sender"])
    assert code == 1
    assert "FAIRPOST_GLOBAL_LIMITS=auto needs ses:GetAccount" in capsys.readouterr().err


def test_settings_accept_auto_only_for_the_global_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", " AUTO ")
    assert load_settings().global_limits == "auto"
    monkeypatch.setenv("FAIRPOST_TENANT_LIMITS", "auto")
    with pytest.raises(Exception, match="FAIRPOST_TENANT_LIMITS"):
        load_settings()


# -- per-tenant SES options ---------------------------------------------------------------


def test_per_tenant_ses_options_are_passed_on_every_send(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "FAIRPOST_TENANTS",
        json.dumps(
            {
                "acme": {
                    "ses_tenant_name": "acme-ses",
                    "configuration_set": "cs-acme",
                    "default_sender": "news@acme.example.com",
                }
            }
        ),
    )
    with ops.daemon(replica="ses1"), MailClient() as client:
        client.send("acme", to=["ada@example.org"], subject="no sender given", text="hi")
        client.send("acme", sender="ceo@acme.example.com", to=["bob@example.org"], subject="own", text="hi")
        client.send("beta", sender="app@example.com", to=["cy@example.org"], subject="plain", text="hi")
        mails = {m.subject: m for m in ops.ses.wait_for(3, timeout=15)}
    assert mails["no sender given"].from_address == "news@acme.example.com"
    assert mails["own"].from_address == "ceo@acme.example.com"
    for subject in ("no sender given", "own"):
        assert mails[subject].tenant_name == "acme-ses"
        assert mails[subject].configuration_set_name == "cs-acme"
    assert mails["plain"].tenant_name is None and mails["plain"].configuration_set_name is None


def test_the_operations_guide_documents_every_metric_and_setting() -> None:
    # The operator half of the README lives in docs/operations.md.
    section = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    for name in DOCUMENTED_METRICS:
        assert f"`{name}`" in section, name
    settings = load_settings()
    for name, value in settings.model_dump().items():
        if isinstance(value, dict) and name != "tenants":
            for inner in value:
                # The console's variables are documented by the names its issue gave them.
                variable = (
                    CONSOLE_VARIABLES[inner]
                    if name == "console"
                    else WEBHOOK_VARIABLES[inner]
                    if name == "webhook"
                    else f"FAIRPOST_{name.upper()}__{inner.upper()}"
                )
                assert f"`{variable}`" in section, (name, inner)
        else:
            assert f"`FAIRPOST_{name.upper()}`" in section, name


# -- stats --watch ------------------------------------------------------------------------


@pytest.fixture
def redis_env(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> dict[str, str]:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_KEY_PREFIX", PREFIX)
    return dict(os.environ)


def _read_until(process: subprocess.Popen[bytes], predicate: Callable[[bytes], bool]) -> bytes:
    """Read the process's stdout until ``predicate(all output so far)``; bounded by the test timeout."""
    assert process.stdout is not None
    seen = b""
    while not predicate(seen):
        chunk = os.read(process.stdout.fileno(), 4096)
        assert chunk, f"the process ended first: {seen!r}"
        seen += chunk
    return seen


def test_stats_watch_json_prints_a_line_per_update(redis_env: dict[str, str]) -> None:
    with MailClient() as client:
        send(client, "acme", 2)
    with subprocess.Popen(
        [sys.executable, "-m", "fairpost.mailer.cli", "stats", "--watch", "--json", "--interval", "0.1"],
        env=redis_env,
        stdout=subprocess.PIPE,
    ) as process:
        try:
            out = _read_until(process, lambda seen: seen.count(b"\n") >= 3)
        finally:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=10) == 0
    lines = [json.loads(line) for line in out.splitlines()[:3]]
    assert all(line["tenants"]["acme"]["backlog"] == 2 for line in lines)
    assert lines[0]["at_ms"] < lines[2]["at_ms"]


def test_stats_watch_is_a_live_table(redis_env: dict[str, str]) -> None:
    with MailClient() as client:
        send(client, "acme", 2)
    # FORCE_COLOR: rich draws the live table although stdout is a pipe.
    with subprocess.Popen(
        [sys.executable, "-m", "fairpost.mailer.cli", "stats", "--watch", "--interval", "0.1"],
        env={**redis_env, "FORCE_COLOR": "1", "COLUMNS": "150"},
        stdout=subprocess.PIPE,
    ) as process:
        try:
            out = _read_until(process, lambda seen: seen.count(b"acme") >= 2)
        finally:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=10) == 0
    assert b"fairpost at" in out and b"backlog" in out


def test_render_table_and_text_agree(redis_env: dict[str, str]) -> None:
    stats = Stats(
        at_ms=0,
        global_=ScopeStats("global", 3, 1, [WindowUsage(1, 14, 2)], "settings"),
        tenants=[ScopeStats("acme", 3, 1, [WindowUsage(60, 10, 10)], "override", retry_after=12.5)],
        replicas=["r1"],
    )
    console = Console(record=True, width=150)
    console.print(render_table(stats))
    table = console.export_text()
    text = render_text(stats)
    for fragment in ("acme", "10/10 per minute", "throttled 12.5s", "override", "2/14 per second"):
        assert fragment in table and fragment in text
