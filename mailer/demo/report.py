"""The demo's verdict: per-tenant numbers and the invariants checked on its own data.

Every figure here is computed from the job records (enqueue and send times)
and from what SQS and the SES emulator report at the end, not from the
daemon's own counters: the demo checks the daemon, it does not trust it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairpost.config import Window
from fairpost.mailer.demo.monitor import JobBook, JobInfo
from fairpost.mailer.demo.scenario import Scenario

if TYPE_CHECKING:
    from fairpost.mailer.demo.webhooks import Received

__all__ = [
    "Check",
    "EndState",
    "Report",
    "WindowPeak",
    "build_report",
    "max_in_window",
]

_WAITING = frozenset({"queued", "claimed", "dispatched"})


@dataclass(frozen=True)
class WindowPeak:
    limit: str
    """The window as written in the settings, e.g. ``8/second``."""
    seconds: int
    allowed: int
    highest: int
    """The most recipients sent in any interval of ``seconds`` (sliding, to the ms)."""
    at_seconds: float | None
    """Where that interval ends, in seconds since the load started."""

    @property
    def ok(self) -> bool:
        return self.highest <= self.allowed


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None
    """None: could not be checked."""
    detail: str


@dataclass
class TenantReport:
    planned: int
    enqueued: int
    sent: int
    recipients: int
    waiting: int
    """Still queued in Redis or waiting in SQS when the demo ended (not lost: held)."""
    dead: int
    missing: int
    windows: list[WindowPeak]
    latency_p50_seconds: float | None
    latency_p99_seconds: float | None
    rate_while_sending: float | None
    """Recipients per second between its first and last send."""


@dataclass
class Report:
    scenario: str
    description: str
    replicas: int
    load_seconds: float
    run_seconds: float
    interrupted: bool
    global_limits: str
    tenants: dict[str, TenantReport]
    global_windows: list[WindowPeak]
    global_sent: int
    global_recipients: int
    checks: list[Check] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    webhooks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per tenant with a webhook endpoint: what the demo's receiver got (:class:`Received`)."""

    @property
    def ok(self) -> bool:
        return all(check.ok is not False for check in self.checks)

    def failed(self) -> list[Check]:
        return [check for check in self.checks if check.ok is False]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        for peaks in [data["global_windows"], *(t["windows"] for t in data["tenants"].values())]:
            for peak in peaks:
                peak["ok"] = peak["highest"] <= peak["allowed"]
        return data

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")


def max_in_window(events: Sequence[tuple[int, int]], window_ms: int) -> tuple[int, int | None]:
    """The largest sum of costs over any interval ``(t - window_ms, t]``, and that ``t``.

    ``events`` are ``(time_ms, cost)``; the interval is the quota engine's window.
    """
    ordered = sorted(events)
    best, best_at, total, lo = 0, None, 0, 0
    for at, cost in ordered:
        total += cost
        while ordered[lo][0] <= at - window_ms:
            total -= ordered[lo][1]
            lo += 1
        if total > best:
            best, best_at = total, at
    return best, best_at


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _peaks(jobs: Sequence[JobInfo], windows: Sequence[Window], origin_ms: int) -> list[WindowPeak]:
    events = [(job.sent_ms, job.recipients) for job in jobs if job.sent_ms is not None]
    peaks = []
    for window in windows:
        highest, at = max_in_window(events, window.seconds * 1000)
        peaks.append(
            WindowPeak(
                limit=str(window),
                seconds=window.seconds,
                allowed=window.limit,
                highest=highest,
                at_seconds=None if at is None else round((at - origin_ms) / 1000, 3),
            )
        )
    return peaks


def _tenant_report(scenario: Scenario, tenant: str, book: JobBook, origin_ms: int) -> TenantReport:
    jobs = book.of(tenant)
    sent = [job for job in jobs if job.state == "sent" and job.sent_ms is not None]
    latencies = [
        (job.sent_ms - job.created_ms) / 1000
        for job in sent
        if job.sent_ms is not None and job.created_ms is not None
    ]
    recipients = sum(job.recipients for job in sent)
    rate = None
    if len(sent) >= 2:
        events = sorted((job.sent_ms, job.recipients) for job in sent if job.sent_ms is not None)
        span = (events[-1][0] - events[0][0]) / 1000
        # What went out after the first instant, over the time it took: counting the
        # first instant's mail too would show a quota-bound tenant above its quota.
        first = sum(units for at, units in events if at == events[0][0])
        rate = round((recipients - first) / span, 2) if span > 0 else None
    return TenantReport(
        planned=scenario.planned(tenant),
        enqueued=len(jobs),
        sent=len(sent),
        recipients=recipients,
        waiting=sum(1 for job in jobs if job.state in _WAITING),
        dead=sum(1 for job in jobs if job.state == "dead"),
        missing=sum(1 for job in jobs if job.state == "missing"),
        windows=_peaks(sent, scenario.limits_for(tenant), origin_ms),
        latency_p50_seconds=_round(percentile(latencies, 50)),
        latency_p99_seconds=_round(percentile(latencies, 99)),
        rate_while_sending=rate,
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class EndState:
    """What the emulators hold when the demo ends."""

    sqs_messages: int | None
    """Messages left in the queue (visible, in flight, delayed); None if unknown."""
    ses_mails: int | None
    """Mails SES accepted during the run; None if the emulator cannot say."""
    ses_recipients: int | None
    ses_duplicates: dict[str, int] | None = None
    """Subjects SES accepted more than once (each demo mail's subject is unique)."""


def build_report(
    scenario: Scenario,
    book: JobBook,
    *,
    replicas: int,
    origin_ms: int,
    run_seconds: float,
    interrupted: bool,
    end: EndState,
    webhooks: dict[str, Received] | None = None,
    simulated: bool = True,
) -> Report:
    """``webhooks``: what the receiver got per tenant with an endpoint; ``simulated``: SES's
    events come from the demo's own SES (its mailbox simulator reports bounces and deliveries)."""
    tenants = {t: _tenant_report(scenario, t, book, origin_ms) for t in scenario.tenants}
    all_sent = book.sent()
    report = Report(
        scenario=scenario.name,
        description=scenario.description,
        replicas=replicas,
        load_seconds=scenario.duration,
        run_seconds=round(run_seconds, 1),
        interrupted=interrupted,
        global_limits="; ".join(str(w) for w in scenario.global_limits),
        tenants=tenants,
        global_windows=_peaks(all_sent, scenario.global_limits, origin_ms),
        global_sent=len(all_sent),
        global_recipients=sum(job.recipients for job in all_sent),
    )
    report.checks = _checks(report, book, end)
    isolation = _isolation_check(scenario, report, book, origin_ms)
    if isolation is not None:
        report.checks.append(isolation)
    if webhooks is not None:
        report.webhooks = {tenant: r.to_json() for tenant, r in webhooks.items()}
        report.checks.append(_webhook_check(scenario, book, webhooks, simulated))
    return report


def _webhook_check(
    scenario: Scenario, book: JobBook, webhooks: dict[str, Received], simulated: bool
) -> Check:
    """Each tenant's outcomes reached its endpoint, signed: every sent job's ``mail.sent``,
    and (where the demo's SES simulates them) its bounces and deliveries; no delivery
    failed verification."""
    failed: list[str] = []
    seen: list[str] = []
    for tenant, got in sorted(webhooks.items()):
        types = got.by_type()
        if got.unverified:
            failed.append(f"{got.unverified} deliveries to {tenant}'s endpoint failed verification")
        if not types:
            failed.append(f"no event reached {tenant}'s endpoint")
            continue
        expected = ["mail.sent"]
        if simulated:
            expected.append("mail.delivered")
            if scenario.tenants[tenant].bounce > 0:
                expected.append("mail.bounced")
        absent = [t for t in expected if t not in types]
        if absent:
            failed.append(f"no {' or '.join(absent)} reached {tenant}'s endpoint")
        missing = book.sent_ids(tenant) - got.sent_jobs
        if missing:
            failed.append(f"{len(missing)} of {tenant}'s sent jobs never had their mail.sent delivered")
        seen.append(f"{tenant}: {', '.join(expected)} received, a mail.sent for every sent job")
    detail = "; ".join(failed) or "; ".join(seen) + ", every signature valid"
    return Check("webhooks reach the application", not failed, detail)


BACKLOGGED_SHARE = 0.95
"""A backlogged tenant sends at least this share of its quota."""
LIGHT_P99_SECONDS = 0.5
LIGHT_P99_GROWTH = 1.5
LIGHT_P99_SLACK_SECONDS = 0.1
"""Below this, a p99 measures the jitter of a poll and a linger (tens of milliseconds),
not a wait: growth within it is no growth."""


def _quota_rate(windows: Sequence[Window], horizon: float) -> float | None:
    """Recipients a second the tightest window that can bind within ``horizon`` allows."""
    rates = [w.limit / w.seconds for w in windows if w.seconds <= horizon]
    return min(rates) if rates else None


def _isolation_check(scenario: Scenario, report: Report, book: JobBook, origin_ms: int) -> Check | None:
    """The title's promise, where a scenario makes it: one tenant's burst is its own.

    It applies when some tenant bursts more than its quota can send before the load
    ends (it stays backlogged throughout; a bouncing one is the guard's to slow)
    while others only trickle, and the global
    quota has room for all of them (where it binds, the burst must share it: the
    crowd scenario). The burst tenant sends
    at 95 % of its quota while it has a backlog; every trickling tenant's p99
    enqueue-to-SES stays within 0.5 s, and within 1.5 times its p99 before the burst
    (or 0.1 s more: :data:`LIGHT_P99_SLACK_SECONDS`).
    """
    noisy: list[tuple[str, float, float]] = []
    light: list[str] = []
    demand = 0.0
    for tenant, load in scenario.tenants.items():
        rate = _quota_rate(scenario.limits_for(tenant), scenario.duration)
        if rate is None:
            return None
        backlogged = load.burst > rate * (scenario.duration - load.burst_at)
        if load.burst_at <= scenario.duration and backlogged and load.bounce == 0:
            noisy.append((tenant, rate, load.burst_at))
            demand += rate
        elif load.rate > 0 and load.burst == 0 and load.bounce == 0:
            light.append(tenant)
            demand += load.rate * load.recipients
    global_rate = _quota_rate(scenario.global_limits, scenario.duration)
    if not noisy or not light or global_rate is None or demand > global_rate:
        return None
    failed: list[str] = []
    held: list[str] = []
    for tenant, rate, _ in noisy:
        sent_rate = report.tenants[tenant].rate_while_sending
        if sent_rate is None or sent_rate < BACKLOGGED_SHARE * rate:
            failed.append(f"{tenant} sent {sent_rate}/s while backlogged, under 95% of its {rate:g}/s")
        else:
            held.append(f"{tenant} at {sent_rate / rate:.0%} of its quota")
    burst_ms = origin_ms + int(min(at for _, _, at in noisy) * 1000)
    for tenant in light:
        before: list[float] = []
        after: list[float] = []
        for job in book.of(tenant):
            if job.state == "sent" and job.sent_ms is not None and job.created_ms is not None:
                latency = (job.sent_ms - job.created_ms) / 1000
                (before if job.created_ms < burst_ms else after).append(latency)
        p99_before, p99_after = percentile(before, 99), percentile(after, 99)
        if p99_after is None:
            failed.append(f"{tenant} sent nothing after the burst")
            continue
        if p99_after > LIGHT_P99_SECONDS:
            failed.append(f"{tenant}'s p99 was {p99_after:.2f} s after the burst, over {LIGHT_P99_SECONDS} s")
        elif p99_before is not None and p99_after > max(
            LIGHT_P99_GROWTH * p99_before, p99_before + LIGHT_P99_SLACK_SECONDS
        ):
            failed.append(f"{tenant}'s p99 grew from {p99_before:.2f} s to {p99_after:.2f} s with the burst")
    quiet = f"the {len(light)} others' p99 within {LIGHT_P99_SECONDS} s and unchanged by the burst"
    return Check("a burst is its own", not failed, "; ".join(failed) or f"{', '.join(held)}; {quiet}")


def _checks(report: Report, book: JobBook, end: EndState) -> list[Check]:
    checks = []
    over = [
        f"{scope}: {peak.highest} recipients in a {peak.limit} window ending at {peak.at_seconds}s"
        for scope, peaks in [("global", report.global_windows)]
        + [(f"tenant {t}", r.windows) for t, r in report.tenants.items()]
        for peak in peaks
        if not peak.ok
    ]
    checks.append(
        Check(
            "never over quota",
            not over,
            "; ".join(over) or "no sliding window over its limit, globally or for any tenant",
        )
    )

    lost = []
    for tenant, t in report.tenants.items():
        if t.dead:
            lost.append(f"tenant {tenant}: {t.dead} dead letters")
        if t.missing:
            lost.append(f"tenant {tenant}: {t.missing} job records gone")
    in_sqs = sum(1 for job in book.jobs.values() if job.state == "dispatched")
    if end.sqs_messages is not None and in_sqs > end.sqs_messages:
        lost.append(f"{in_sqs} jobs handed to SQS and unsent, but only {end.sqs_messages} messages in SQS")
    waiting = sum(t.waiting for t in report.tenants.values())
    checks.append(
        Check(
            "nothing lost",
            not lost,
            "; ".join(lost)
            or (
                f"every job sent ({report.global_sent})"
                if not waiting
                else f"{report.global_sent} sent; {waiting} still waiting their turn (none lost)"
            ),
        )
    )

    if end.ses_mails is None:
        checks.append(Check("sent at most once", None, "the SES emulator does not report sent mail"))
    else:
        dup = []
        if end.ses_mails != report.global_sent:
            dup.append(f"SES accepted {end.ses_mails} mails for {report.global_sent} sent jobs")
        if end.ses_duplicates:
            twice = ", ".join(f"{s!r} {n} times" for s, n in sorted(end.ses_duplicates.items())[:10])
            dup.append(f"sent more than once: {twice}")
        if end.ses_recipients is not None and end.ses_recipients != report.global_recipients:
            dup.append(f"SES counted {end.ses_recipients} recipients, the jobs {report.global_recipients}")
        checks.append(
            Check(
                "sent at most once",
                not dup,
                "; ".join(dup) or f"SES accepted {end.ses_mails} mails, one per sent job",
            )
        )
    return checks
