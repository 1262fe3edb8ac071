"""The demo checks its title's promise on its own data: a burst is its own.

Pure: a scenario and a book of jobs made here, no services.
"""

from __future__ import annotations

from fairpost.mailer.demo.monitor import JobBook, JobInfo
from fairpost.mailer.demo.report import Check, EndState, build_report
from fairpost.mailer.demo.scenario import parse_scenario

SCENARIO = """
description = "one noisy tenant bursts; two others trickle on, unaffected"
duration = 20
global_limits = "40/second"
tenant_limits = "8/second"

[tenants.noisy]
burst = 1000
burst_at = 5

[tenants.acme]
rate = 2

[tenants.globex]
rate = 1
"""


def book(noisy_rate: float, light_latency_after: float) -> JobBook:
    """Light tenants at 50 ms before the burst (at 5 s) and ``light_latency_after`` after;
    the noisy tenant sending at ``noisy_rate`` a second from the burst on."""
    jobs = JobBook()
    for tenant in ("acme", "globex"):
        for i in range(40):
            created = i * 500
            latency = 0.05 if created < 5000 else light_latency_after
            jobs.jobs[f"{tenant}-{i}"] = JobInfo(tenant, 1, "sent", created, created + int(latency * 1000))
    sent = int(noisy_rate * 15)
    for i in range(1000):
        at = 5000 + int(i * 1000 / noisy_rate) if i < sent else None
        jobs.jobs[f"noisy-{i}"] = JobInfo("noisy", 1, "sent" if at else "queued", 5000, at)
    return jobs


def promise(jobs: JobBook) -> Check:
    scenario = parse_scenario(SCENARIO, "test")
    end = EndState(sqs_messages=0, ses_mails=None, ses_recipients=None)
    report = build_report(scenario, jobs, replicas=1, origin_ms=0, run_seconds=20, interrupted=False, end=end)
    (check,) = [c for c in report.checks if c.name == "a burst is its own"]
    return check


def test_a_burst_held_at_its_quota_beside_unhurried_trickles_keeps_the_promise() -> None:
    check = promise(book(noisy_rate=8, light_latency_after=0.06))
    assert check.ok is True, check.detail


def test_a_burst_tenant_under_95_percent_of_its_quota_breaks_it() -> None:
    check = promise(book(noisy_rate=6.2, light_latency_after=0.06))
    assert check.ok is False and "noisy" in check.detail and "95%" in check.detail


def test_trickles_slowed_past_half_a_second_break_it() -> None:
    check = promise(book(noisy_rate=8, light_latency_after=1.1))
    assert check.ok is False and "acme" in check.detail and "0.5 s" in check.detail


def test_trickles_slowed_by_half_again_break_it() -> None:
    check = promise(book(noisy_rate=8, light_latency_after=0.2))
    assert check.ok is False and "grew from 0.05 s to 0.20 s" in check.detail


def test_jitter_of_tens_of_milliseconds_is_no_growth() -> None:
    check = promise(book(noisy_rate=8, light_latency_after=0.12))
    assert check.ok is True, check.detail
