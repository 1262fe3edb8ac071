"""What the demo shows: a live table per tenant (or, off a terminal, a plain line every
few seconds), and the summary at the end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fairpost.mailer.demo.monitor import JobBook
from fairpost.mailer.demo.report import Report, WindowPeak
from fairpost.mailer.demo.scenario import Scenario
from fairpost.mailer.ops.stats import ScopeStats, Stats, WindowUsage

__all__ = ["LiveView", "Phase", "print_summary"]

_PLAIN_EVERY = 5.0


@dataclass(frozen=True)
class Phase:
    name: str
    """starting, load, drain, stopping."""
    elapsed: float
    """Seconds since the load started."""
    total: float
    """Seconds of load plus the longest drain."""


def _usage(windows: Sequence[WindowUsage]) -> str:
    if not windows:
        return "-"
    return f"{windows[0].used}/{windows[0].limit} per {windows[0].name}"


def _paused(seconds: float) -> str:
    return f"+{seconds:.1f}s" if seconds > 0 else ""


class LiveView:
    """The live table on a terminal; a periodic plain line elsewhere (CI, a pipe)."""

    def __init__(self, console: Console, scenario: Scenario, replicas: int) -> None:
        self.console = console
        self.scenario = scenario
        self.replicas = replicas
        self.live_mode = console.is_terminal
        self._last_plain = -_PLAIN_EVERY
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
        )
        self._run_task = self._progress.add_task("run ", total=1.0, note="")
        self._mail_task = self._progress.add_task("sent", total=max(1, scenario.total_planned()), note="")
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def update(self, phase: Phase, stats: Stats, book: JobBook) -> None:
        """Show ``stats`` (:func:`fairpost.mailer.ops.stats.collect_stats` of the scenario's tenants)."""
        if self._live is not None:
            self._live.update(self._render(phase, stats, book))
        elif phase.elapsed - self._last_plain >= _PLAIN_EVERY:
            self._last_plain = phase.elapsed
            self.console.print(self._plain(phase, stats, book), highlight=False, soft_wrap=True)

    def _tenants(self, stats: Stats) -> list[tuple[str, ScopeStats]]:
        """The scenario's tenants, in its order, with their numbers."""
        found = ((tenant, stats.tenant(tenant)) for tenant in self.scenario.tenants)
        return [(tenant, t) for tenant, t in found if t is not None]

    def _plain(self, phase: Phase, stats: Stats, book: JobBook) -> str:
        parts = [f"[{phase.elapsed:5.1f}s {phase.name}]"]
        sent_all = book.sent()
        g = stats.global_
        paused = f" paused {_paused(g.retry_after)}" if g.retry_after > 0 else ""
        parts.append(
            f"all: sent {len(sent_all)}/{self.scenario.total_planned()}, {_usage(g.windows)}{paused}"
        )
        for tenant, t in self._tenants(stats):
            parts.append(
                f"{tenant}: backlog {t.backlog} in flight {t.inflight} sent {len(book.sent(tenant))} "
                f"{_usage(t.windows)}" + (f" paused {_paused(t.retry_after)}" if t.retry_after > 0 else "")
            )
        return " | ".join(parts)

    def _render(self, phase: Phase, stats: Stats, book: JobBook) -> RenderableType:
        table = Table(
            title=f"fairpost demo: {self.scenario.name}, {self.replicas} replicas ({phase.name})",
            title_justify="left",
            expand=False,
        )
        table.add_column("tenant")
        table.add_column("load", justify="right")
        table.add_column("backlog", justify="right")
        table.add_column("in flight", justify="right")
        table.add_column("sent", justify="right")
        table.add_column("rate / limit", justify="right")
        table.add_column("paused until", justify="right")
        table.add_column("bounce / complaint", justify="right")
        for tenant, t in self._tenants(stats):
            load = self.scenario.tenants[tenant]
            describe = []
            if load.burst:
                describe.append(f"burst {load.burst:,}")
            if load.rate:
                describe.append(f"{load.rate:g}/s")
            if load.recipients > 1:
                describe.append(f"{load.recipients} rcpt each")
            count, limit = (t.windows[0].used, t.windows[0].limit) if t.windows else (0, 1)
            style = "bold red" if count >= limit else ("yellow" if count >= 0.75 * limit else "green")
            table.add_row(
                tenant,
                " ".join(describe),
                f"{t.backlog:,}",
                str(t.inflight),
                f"{len(book.sent(tenant)):,}/{self.scenario.planned(tenant):,}",
                Text(_usage(t.windows), style=style),
                Text(_paused(t.retry_after), style="red"),
                _reputation(t),
            )
        table.add_section()
        g = stats.global_
        table.add_row(
            Text("all (global)", style="bold"),
            "",
            f"{g.backlog:,}",
            str(g.inflight),
            f"{len(book.sent()):,}/{self.scenario.total_planned():,}",
            _usage(g.windows),
            Text(_paused(g.retry_after), style="red"),
            "",
        )
        fraction = min(1.0, max(0.0, phase.elapsed / phase.total)) if phase.total else 0.0
        self._progress.update(self._run_task, completed=fraction, note=phase.name)
        self._progress.update(self._mail_task, completed=len(book.sent()), note="mails")
        return Group(table, self._progress)


def _reputation(scope: ScopeStats) -> Text:
    """The tenant's 24-hour bounce and complaint rates, and what the guard did."""
    if scope.reputation is None or not scope.reputation.windows[0].sends:
        return Text("-")
    w = scope.reputation.windows[0]
    text = Text(f"{w.bounce_rate:.1%} / {w.complaint_rate:.2%}")
    if scope.held is not None:
        text.append(" " + scope.held.replace("_", " "), style="bold red")
    return text


def print_summary(console: Console, report: Report) -> None:
    table = Table(title=f"summary: {report.scenario}", title_justify="left")
    table.add_column("tenant")
    table.add_column("sent", justify="right")
    table.add_column("waiting", justify="right")
    table.add_column("recipients", justify="right")
    table.add_column("highest window / limit", justify="left")
    table.add_column("rate", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")

    def peaks(windows: Sequence[WindowPeak]) -> Text:
        text = Text()
        for i, peak in enumerate(windows):
            if i:
                text.append(", ")
            per = peak.limit.split("/", 1)[1]
            text.append(f"{peak.highest}/{peak.allowed} per {per}", style="green" if peak.ok else "bold red")
        return text

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}s"

    for tenant, t in report.tenants.items():
        table.add_row(
            tenant,
            f"{t.sent:,}/{t.planned:,}",
            f"{t.waiting:,}" if t.waiting else "",
            f"{t.recipients:,}",
            peaks(t.windows),
            "-" if t.rate_while_sending is None else f"{t.rate_while_sending:.1f}/s",
            secs(t.latency_p50_seconds),
            secs(t.latency_p99_seconds),
        )
    table.add_section()
    table.add_row(
        Text("all (global)", style="bold"),
        f"{report.global_sent:,}",
        "",
        f"{report.global_recipients:,}",
        peaks(report.global_windows),
        "",
        "",
        "",
    )
    console.print(table)
    for tenant, got in report.webhooks.items():
        events = ", ".join(f"{n} {kind}" for kind, n in got["events"].items()) or "no events"
        console.print(
            f"  webhooks to {tenant}'s receiver ({got['endpoint']}): {events}; "
            f"{got['deliveries']} deliveries, {got['unverified']} failed verification",
            highlight=False,
        )
    for check in report.checks:
        mark = {True: "[green]ok[/]", False: "[bold red]FAILED[/]", None: "[yellow]not checked[/]"}[check.ok]
        console.print(f"  {mark}  {check.name}: {check.detail}", highlight=False)
    for name, path in report.files.items():
        console.print(f"  {name}: {path}", highlight=False)
