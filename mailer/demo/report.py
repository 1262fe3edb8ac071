"""The demo's verdict: per-tenant numbers, the invariants checked on its own data, and the chart.

Every figure here is computed from the job records (enqueue and send times)
and from what SQS and the SES emulator report at the end, not from the
daemon's own counters: the demo checks the daemon, it does not trust it.
"""

from __future__ import annotations

import csv
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
    "write_chart",
    "write_jobs_csv",
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


# -- the chart -------------------------------------------------------------------

_SMOOTH_SECONDS = 4.0
_STEP_SECONDS = 0.25


def rate_series(events: Sequence[tuple[float, int]], end: float) -> tuple[list[float], list[float]]:
    """Recipients per second, averaged over a window ``(x - 2 s, x + 2 s]`` around each
    sample ``x``, for the samples whose whole window lies within ``[0, end]``.

    An average over whole windows never shows a tenant that kept its
    per-second quota above it.
    """
    xs: list[float] = []
    ys: list[float] = []
    ordered = sorted(events)
    lo = hi = 0
    total = 0
    half = _SMOOTH_SECONDS / 2
    for i in range(int((end - 2 * half) / _STEP_SECONDS) + 1):
        x = half + i * _STEP_SECONDS
        while hi < len(ordered) and ordered[hi][0] <= x + half:
            total += ordered[hi][1]
            hi += 1
        while lo < hi and ordered[lo][0] <= x - half:
            total -= ordered[lo][1]
            lo += 1
        xs.append(x)
        ys.append(total / _SMOOTH_SECONDS)
    return xs, ys


def write_jobs_csv(book: JobBook, origin_ms: int, path: Path) -> None:
    """Every job: the data behind the chart, for anyone who wants to look again."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["job_id", "tenant", "recipients", "state", "enqueued_s", "sent_s"])
        for job_id, job in book.jobs.items():
            out.writerow(
                [
                    job_id,
                    job.tenant,
                    job.recipients,
                    job.state,
                    "" if job.created_ms is None else (job.created_ms - origin_ms) / 1000,
                    "" if job.sent_ms is None else (job.sent_ms - origin_ms) / 1000,
                ]
            )


def _colors(scenario: Scenario) -> dict[str, str]:
    """Red for a lone bursting tenant, distinct colours for everyone else."""
    import matplotlib

    tenants = list(scenario.tenants)
    bursty = [t for t in tenants if scenario.tenants[t].burst]
    table = "tab10" if len(tenants) <= 9 else "tab20"
    cmap = matplotlib.colormaps[table]
    palette = [
        matplotlib.colors.to_hex(cmap(i))
        for i in range(cmap.N)
        if table != "tab10" or i != 3  # tab10's red is kept for the noisy tenant
    ]
    colors: dict[str, str] = {}
    for tenant in tenants:
        if bursty == [tenant]:
            colors[tenant] = "#d62728"
        else:
            colors[tenant] = palette[len(colors) % len(palette)]
    return colors


def _label(scenario: Scenario, tenant: str, report: Report | None) -> str:
    load = scenario.tenants[tenant]
    parts = []
    if load.burst:
        parts.append(f"burst of {load.burst:,}")
    if load.rate:
        parts.append(f"{load.rate:g} mail{'' if load.rate == 1 else 's'}/s")
    if load.recipients > 1:
        parts.append(f"{load.recipients} recipients each")
    label = f"{tenant} ({', '.join(parts)})" if parts else tenant
    numbers = report.tenants.get(tenant) if report else None
    if numbers and numbers.windows and numbers.latency_p99_seconds is not None:
        peak = numbers.windows[0]
        label += f"\n    peak {peak.highest}/{peak.allowed} per {peak.limit.split('/', 1)[1]}"
        label += f", p99 latency {numbers.latency_p99_seconds:.2f}s"
    return label


@dataclass
class ReputationTrace:
    """Bouncing tenants' bounce rates over the run, as the reputation guard counts them
    (bounces / max(sends, min_sends) over 24 h), and when the guard acted."""

    threshold: float
    throttle_at: float
    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    acted: dict[str, list[tuple[float, str]]] = field(default_factory=dict)

    def add(self, elapsed: float, tenant: str, rate: float, level: str | None) -> None:
        self.points.setdefault(tenant, []).append((elapsed, rate))
        seen = self.acted.setdefault(tenant, [])
        if level is not None and (not seen or seen[-1][1] != level):
            seen.append((elapsed, level))


def write_chart(
    scenario: Scenario,
    book: JobBook,
    origin_ms: int,
    end_seconds: float,
    path: Path,
    report: Report | None = None,
    reputation: ReputationTrace | None = None,
) -> None:
    """Each tenant's send rate over time with its quota, everyone stacked against the
    global quota, and each mail's enqueue→SES latency: the picture of isolation; with a
    bouncing tenant, its bounce rate against the guard's threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tenants = list(scenario.tenants)
    colors = _colors(scenario)
    lone = [t for t in tenants if scenario.tenants[t].burst]

    def when(ms: int) -> float:
        return (ms - origin_ms) / 1000

    rates: dict[str, tuple[list[float], list[float]]] = {}
    for tenant in tenants:
        events = [(when(j.sent_ms), j.recipients) for j in book.sent(tenant) if j.sent_ms is not None]
        rates[tenant] = rate_series(events, end_seconds)

    bouncing = reputation is not None and bool(reputation.points)
    ratios = [3, 1.4, 1.6] + ([1.6] if bouncing else [])
    fig, axes = plt.subplots(
        len(ratios), 1, figsize=(13, 9 + (2.5 if bouncing else 0)), sharex=True,
        gridspec_kw={"height_ratios": ratios},
    )  # fmt: skip
    ax_rate, ax_total, ax_lat = axes[0], axes[1], axes[2]
    title = f"fairpost demo: {scenario.name}"
    if scenario.description:
        title += f": {scenario.description}"
    fig.suptitle(title, fontsize=12)

    # Per-tenant send rate, with each distinct tenant quota drawn.
    for tenant in tenants:
        xs, ys = rates[tenant]
        heavy = len(lone) == 1 and tenant in lone
        label = _label(scenario, tenant, report)
        ax_rate.plot(xs, ys, color=colors[tenant], linewidth=2.6 if heavy else 1.4, label=label)
    quotas = sorted({scenario.limits_for(t)[0] for t in tenants}, key=lambda w: w.limit / w.seconds)
    for window in quotas:
        per_second = window.limit / window.seconds
        ax_rate.axhline(per_second, color="black", linestyle="--", linewidth=1)
        ax_rate.annotate(
            f"tenant quota {window}",
            (0.005, per_second),
            xycoords=("axes fraction", "data"),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=9,
        )
    top = max(w.limit / w.seconds for w in quotas)
    ax_rate.set_ylim(0, top * 1.3)
    ax_rate.set_ylabel(f"recipients/s\n({_SMOOTH_SECONDS:g}-s average)")
    ax_rate.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False, labelspacing=0.8)
    ax_rate.set_title("send rate per tenant", fontsize=10, loc="left")
    for tenant in lone:
        load = scenario.tenants[tenant]
        for ax in (ax_rate, ax_total, ax_lat):
            ax.axvline(load.burst_at, color=colors[tenant], linestyle=":", linewidth=1.2)
        ax_rate.annotate(
            f"{tenant} enqueues {load.burst:,} mails at once",
            (load.burst_at, top * 1.22),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=9,
            color=colors[tenant],
        )

    # All tenants together, stacked, against the global quota.
    xs = rates[tenants[0]][0]
    ax_total.stackplot(xs, *(rates[t][1] for t in tenants), colors=[colors[t] for t in tenants], alpha=0.85)
    global_window = scenario.global_limits[0]
    global_rate = global_window.limit / global_window.seconds
    ax_total.axhline(global_rate, color="black", linestyle="--", linewidth=1)
    ax_total.annotate(
        f"global quota {global_window}",
        (0.005, global_rate),
        xycoords=("axes fraction", "data"),
        xytext=(0, -11),
        textcoords="offset points",
        fontsize=9,
    )
    ax_total.set_ylim(0, global_rate * 1.15)
    ax_total.set_ylabel("recipients/s")
    ax_total.set_title("all tenants, stacked", fontsize=10, loc="left")

    # Latency from enqueue to SES, per mail.
    for tenant in tenants:
        points = [
            (when(j.sent_ms), (j.sent_ms - j.created_ms) / 1000)
            for j in book.sent(tenant)
            if j.sent_ms is not None and j.created_ms is not None
        ]
        if points:
            xs_lat, ys_lat = [p[0] for p in points], [max(p[1], 0.01) for p in points]
            ax_lat.scatter(xs_lat, ys_lat, s=5, color=colors[tenant])
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("enqueue → SES (s)")
    ax_lat.set_title("latency of each mail", fontsize=10, loc="left")
    ax_lat.set_xlabel("seconds since the load started")
    if bouncing and reputation is not None:
        ax_lat.set_xlabel("")
        _bounce_panel(axes[3], reputation, colors)

    for ax in axes:
        ax.axvspan(scenario.duration, max(end_seconds, scenario.duration), color="0.92", zorder=0)
        ax.grid(alpha=0.3)
        ax.set_xlim(0, end_seconds)
    ax_lat.annotate(
        "drain",
        (scenario.duration, 0.03),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0),
        textcoords="offset points",
        fontsize=8,
        color="0.35",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _bounce_panel(ax: Any, trace: ReputationTrace, colors: dict[str, str]) -> None:
    """The bouncing tenants' bounce rate against the threshold, with the guard's actions."""
    top = trace.threshold * 1.6
    for tenant, points in trace.points.items():
        ax.plot([p[0] for p in points], [p[1] * 100 for p in points], color=colors[tenant], linewidth=2)
        top = max(top, max(p[1] for p in points) * 1.2)
        for at, level in trace.acted.get(tenant, []):
            color = "red" if level == "paused" else "darkorange"
            ax.axvline(at, color=color, linewidth=1.2)
            ax.annotate(
                f"{tenant} {level}", (at, top * 100 * 0.9), xytext=(4, 0), textcoords="offset points",
                fontsize=9, color=color,
            )  # fmt: skip
    for line, style in ((trace.threshold, "--"), (trace.threshold * trace.throttle_at, ":")):
        ax.axhline(line * 100, color="black", linestyle=style, linewidth=1)
    ax.annotate(
        f"pause at {trace.threshold:.0%}, throttle at {trace.threshold * trace.throttle_at:.0%}",
        (0.005, trace.threshold * 100), xycoords=("axes fraction", "data"), xytext=(0, 3),
        textcoords="offset points", fontsize=9,
    )  # fmt: skip
    ax.set_ylim(0, top * 100)
    ax.set_ylabel("bounce rate %\n(over ≥ 200 sends)")
    ax.set_title("bounce rate as the reputation guard counts it", fontsize=10, loc="left")
    ax.set_xlabel("seconds since the load started")
