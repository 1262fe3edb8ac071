"""``fairpost demo``: set up, run the scenario against real daemon replicas, judge, clean up."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio
from rich.console import Console

from fairpost.config import Settings
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.demo.backends import (
    SHUTDOWN_GRACE,
    Backends,
    add_endpoints,
    demo_settings,
    find_backends,
    init_aws,
    start_ses_events,
    undo,
)
from fairpost.mailer.demo.chart import ReputationTrace, write_chart, write_jobs_csv
from fairpost.mailer.demo.load import generate_load
from fairpost.mailer.demo.monitor import JobBook
from fairpost.mailer.demo.report import EndState, build_report
from fairpost.mailer.demo.scenario import Scenario, load_scenario
from fairpost.mailer.demo.services import (
    ManagedProcess,
    demo_env,
    replica_ready,
    start_replica,
)
from fairpost.mailer.demo.view import LiveView, Phase, print_summary
from fairpost.mailer.demo.webhooks import Receiver
from fairpost.mailer.errors import DemoError
from fairpost.mailer.ops.stats import Stats, collect_stats
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.client import AsyncMailClient
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.pending import pending_deliveries

__all__ = ["run_demo"]

_TICK = 0.25
_REPLICA_START_TIMEOUT = 30.0
_WEBHOOK_SETTLE_SECONDS = 20.0
"""After the drain, at most this long for the webhook deliveries still pending."""


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The ``demo`` command: returns the exit code (1 names the invariant that failed)."""
    scenario = load_scenario(args.scenario).with_duration(args.duration)
    replicas: int = args.replicas
    if not 1 <= replicas <= 16:
        raise DemoError(f"--replicas must be between 1 and 16, not {replicas}")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    # Off a terminal (CI, a pipe), rich would wrap at 80 columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    # SIGTERM cleans up like Ctrl-C: every child runs in its own session and
    # would outlive a demo killed outright.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with contextlib.ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairpost-demo-")))
            console.print(f"fairpost demo: scenario [bold]{scenario.name}[/] ({scenario.description})")
            backends = find_backends(settings, workdir, stack, console)
            if scenario.ses_events():
                start_ses_events(backends, stack, console)
            run_settings, config_file = demo_settings(backends, scenario, workdir)
            init_aws(backends, run_settings)
            stack.callback(undo, backends, run_settings)
            receiver = None
            if scenario.webhook_tenants():
                receiver = Receiver().start()
                stack.callback(receiver.stop)
                add_endpoints(receiver, scenario, run_settings, console)
            env = demo_env(os.environ, config_file, backends.aws_env)
            for name in backends.aws_drop:
                env.pop(name, None)
            demo = Demo(console, scenario, run_settings, backends, replicas, workdir, env, output, receiver)
            return asyncio.run(demo.run())
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the run -----------------------------------------------------------------------


class Demo:
    def __init__(
        self,
        console: Console,
        scenario: Scenario,
        settings: Settings,
        backends: Backends,
        replicas: int,
        workdir: Path,
        env: dict[str, str],
        output: Path,
        receiver: Receiver | None = None,
    ) -> None:
        self.console = console
        self.receiver = receiver
        self.scenario = scenario
        self.settings = settings
        self.backends = backends
        self.replica_count = replicas
        self.workdir = workdir
        self.env = env
        self.output = output
        self.keys = MailKeys(settings.key_prefix)
        self.book = JobBook()
        r = settings.reputation
        self.trace = ReputationTrace(r.bounce_threshold, r.throttle_at) if scenario.bounces() else None
        self.signals = 0
        self.stop = asyncio.Event()
        self.replicas: list[ManagedProcess] = []

    async def run(self) -> int:
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            self.signals += 1
            self.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            # remove_signal_handler restores SIG_DFL for SIGTERM: keep it cleaning up.
            signal.signal(signal.SIGTERM, signal.default_int_handler)

    async def _run(self) -> int:
        client = async_redis_client(self.settings)
        try:
            return await self._with_replicas(client)
        finally:
            await self._stop_replicas()
            await client.aclose()

    async def _with_replicas(self, client: redis.asyncio.Redis) -> int:
        started_at = time.monotonic()
        baseline = await asyncio.to_thread(self._ses_counts)
        for i in range(self.replica_count):
            self.replicas.append(start_replica(i + 1, self.workdir, self.env))
        with LiveView(self.console, self.scenario, self.replica_count) as view:
            await self._wait_ready(view)
            if self.stop.is_set():
                return 130
            origin_ms = await _redis_ms(client)
            end_seconds, error = await self._watch(client, view)
            if not error and not self.stop.is_set():
                await self._settle_webhooks(client, view)
            view.message(
                "stopping the replicas (SIGTERM; they hand back what they hold)"
                if not error
                else f"[bold red]{error}[/]"
            )
        await self._stop_replicas()
        return await self._judge(client, baseline, started_at, origin_ms, end_seconds, error)

    async def _watch(self, client: redis.asyncio.Redis, view: LiveView) -> tuple[float, str | None]:
        """Run the load and show its progress until the drain ends, a replica or the load
        fails, or the user stops it: how long it ran, and what went wrong, if anything."""
        loop = asyncio.get_running_loop()
        sdk = AsyncMailClient(self.settings, redis_client=client)
        tenants = list(self.scenario.tenants)
        quota = QuotaEngine(client, self.keys)
        error: str | None = None
        started = loop.time()
        load = asyncio.create_task(
            generate_load(sdk, self.scenario, self.book, started, self.stop), name="demo-load"
        )
        total = self.scenario.duration + self.scenario.drain
        try:
            while True:
                elapsed = loop.time() - started
                error = self._trouble(load)
                if error:
                    break
                await self.book.refresh(client, self.keys)
                drained = load.done() and self.book.open_count == 0
                if elapsed >= self.scenario.duration and (drained or elapsed >= total):
                    break
                name = "load" if elapsed < self.scenario.duration else "drain"
                # The numbers `fairpost stats` shows: the demo's settings carry the scenario's limits.
                stats = await collect_stats(client, self.keys, self.settings, quota=quota, tenants=tenants)
                view.update(Phase(name, elapsed, total), stats, self.book)
                self._trace(elapsed, stats)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=_TICK)
                if self.stop.is_set():
                    break
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        return loop.time() - started, error

    async def _judge(
        self,
        client: redis.asyncio.Redis,
        baseline: SesCounts,
        started_at: float,
        origin_ms: int,
        end_seconds: float,
        error: str | None,
    ) -> int:
        """With the replicas stopped: the report, its files and the exit code."""
        logs = self._save_logs()
        await self.book.refresh(client, self.keys, everything=True)
        end = await asyncio.to_thread(self._end_state, baseline)
        report = build_report(
            self.scenario,
            self.book,
            replicas=self.replica_count,
            origin_ms=origin_ms,
            run_seconds=time.monotonic() - started_at,
            interrupted=self.stop.is_set() or error is not None,
            end=end,
            webhooks=None if self.receiver is None else self.receiver.received(),
            simulated=self.backends.ses_server is not None,
        )
        chart = self.output / "rates.png"
        summary = self.output / "summary.json"
        await asyncio.to_thread(
            write_chart, self.scenario, self.book, origin_ms, end_seconds, chart, report, self.trace
        )
        jobs = self.output / "jobs.csv"
        write_jobs_csv(self.book, origin_ms, jobs)
        report.files = {"summary": str(summary), "chart": str(chart), "jobs": str(jobs), "logs": str(logs)}
        report.write_json(summary)
        print_summary(self.console, report)
        if error:
            return 1
        if self.stop.is_set():
            self.console.print("interrupted", style="yellow")
            return 130
        for check in report.failed():
            self.console.print(f"[bold red]invariant failed: {check.name}[/]: {check.detail}")
        return 0 if report.ok else 1

    def _trace(self, elapsed: float, stats: Stats) -> None:
        """Note each bouncing tenant's bounce rate, as the guard counts it, for the chart."""
        if self.trace is None:
            return
        for tenant, load in self.scenario.tenants.items():
            scope = stats.tenant(tenant)
            if load.bounce <= 0 or scope is None or scope.reputation is None:
                continue
            w = scope.reputation.windows[0]
            rate = w.judged_bounces / max(w.judged_sends, self.settings.reputation.min_sends)
            self.trace.add(elapsed, tenant, rate, scope.guard.level if scope.guard else None)

    async def _settle_webhooks(self, client: redis.asyncio.Redis, view: LiveView) -> None:
        """Let the replicas deliver what is pending at the webhook endpoints (bounded), so
        the report sees every outcome of the run reach the receiver."""
        if self.receiver is None:
            return
        view.message("waiting for the webhook deliveries still pending")
        deadline = time.monotonic() + _WEBHOOK_SETTLE_SECONDS
        while time.monotonic() < deadline and not self.stop.is_set():
            await self.book.refresh(client, self.keys, everything=True)
            pending = await pending_deliveries(client, self.keys)
            received = self.receiver.received()
            if all(
                (tenant not in pending or pending[tenant].pending == 0)
                and self.book.sent_ids(tenant) <= received[tenant].sent_jobs
                for tenant in received
            ):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=_TICK)

    def _save_logs(self) -> Path:
        """Keep the replicas' logs beside the summary: the temporary directory goes."""
        logs = self.output / "logs"
        logs.mkdir(exist_ok=True)
        for proc in self.replicas:
            with contextlib.suppress(OSError):
                shutil.copyfile(proc.log_path, logs / proc.log_path.name)
        return logs

    def _trouble(self, load: asyncio.Task[None]) -> str | None:
        for proc in self.replicas:
            if not proc.running():
                code = proc.process.returncode
                return f"{proc.name} exited (code {code}); its log ends:\n{proc.log_tail()}"
        if load.done() and not load.cancelled() and load.exception() is not None:
            return f"the load generator failed: {load.exception()!r}"
        return None

    async def _wait_ready(self, view: LiveView) -> None:
        view.message(f"starting {self.replica_count} daemon replicas (fairpost run)…")
        deadline = time.monotonic() + _REPLICA_START_TIMEOUT
        while not all(replica_ready(p) for p in self.replicas):
            for proc in self.replicas:
                if not proc.running():
                    raise DemoError(f"{proc.name} exited at start:\n{proc.log_tail()}")
            if time.monotonic() > deadline:
                raise DemoError(f"the replicas did not start within {_REPLICA_START_TIMEOUT:.0f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=0.1)
            if self.stop.is_set():
                return
        pids = ", ".join(str(p.pid) for p in self.replicas)
        view.message(f"replicas running (pids {pids}); load for {self.scenario.duration:g}s")

    async def _stop_replicas(self) -> None:
        """SIGTERM, then SIGKILL after the grace (at once on a second Ctrl-C)."""
        running = [p for p in self.replicas if p.running()]
        for proc in running:
            proc.signal(signal.SIGTERM)
        signals = self.signals
        deadline = time.monotonic() + SHUTDOWN_GRACE + 4
        while any(p.running() for p in running):
            if time.monotonic() > deadline or self.signals > max(signals, 1):
                for proc in running:
                    proc.signal(signal.SIGKILL)
            await asyncio.sleep(0.05)

    # -- reading the emulators (blocking; run in a thread) --------------------------

    def _ses_counts(self) -> SesCounts:
        """What SES has accepted so far, as far as the emulator says."""
        subjects: Counter[str] | None = None
        recipients = None
        if self.backends.ses_server is not None:
            sent = self.backends.ses_server.sent
            return SesCounts(Counter(str(m.subject) for m in sent), sum(m.recipient_count for m in sent))
        if self.backends.ses_endpoint:
            try:
                url = self.backends.ses_endpoint.rstrip("/") + "/moto-api/data.json"
                with urllib.request.urlopen(url, timeout=30) as response:
                    data = json.load(response)
                subjects = Counter(str(m.get("subject")) for m in data.get("ses", {}).get("Message", []))
            except (OSError, ValueError, AttributeError):
                subjects = None
        with contextlib.suppress(Exception), contextlib.closing(self.backends.boto3_client("ses")) as ses:
            quota = ses.get_send_quota()
            recipients = int(quota["SentLast24Hours"])
        return SesCounts(subjects, recipients)

    def _end_state(self, baseline: SesCounts) -> EndState:
        now = self._ses_counts()
        ses_mails = duplicates = None
        if now.subjects is not None and baseline.subjects is not None:
            during = now.subjects - baseline.subjects
            ses_mails = sum(during.values())
            duplicates = {subject: n for subject, n in during.items() if n > 1}
        sqs_messages = None
        with contextlib.suppress(Exception), contextlib.closing(self.backends.boto3_client("sqs")) as sqs:
            url = sqs.get_queue_url(QueueName=self.settings.queue_name)["QueueUrl"]
            names = [
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ]
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
            sqs_messages = sum(int(attributes.get(n, 0)) for n in names)
        return EndState(
            sqs_messages=sqs_messages,
            ses_mails=ses_mails,
            ses_recipients=_delta(now.recipients, baseline.recipients),
            ses_duplicates=duplicates,
        )


@dataclass(frozen=True)
class SesCounts:
    subjects: Counter[str] | None
    """Accepted mails by subject (each demo mail's subject is unique), from the recording SES
    or moto's data."""
    recipients: int | None
    """SES's SentLast24Hours."""


def _delta(now: int | None, before: int | None) -> int | None:
    return None if now is None or before is None else now - before


async def _redis_ms(client: redis.asyncio.Redis) -> int:
    return time_ms(await client.time())
