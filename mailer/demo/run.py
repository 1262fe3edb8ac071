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
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from rich.console import Console

from fairpost.config import Settings
from fairpost.dispatcher.connect import async_redis_client, redis_client
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.demo.load import SENDER_DOMAIN, generate_load
from fairpost.mailer.demo.monitor import JobBook
from fairpost.mailer.demo.report import EndState, ReputationTrace, build_report, write_chart, write_jobs_csv
from fairpost.mailer.demo.scenario import Scenario, load_scenario
from fairpost.mailer.demo.services import (
    ManagedProcess,
    demo_env,
    replica_ready,
    start_fifo_sqs,
    start_redis,
    start_replica,
)
from fairpost.mailer.demo.view import LiveView, Phase, print_summary
from fairpost.mailer.demo.webhooks import Receiver
from fairpost.mailer.errors import DemoError
from fairpost.mailer.ops.stats import Stats, collect_stats
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.client import AsyncMailClient
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.sdk.outcomes.pending import pending_deliveries
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.ses_tenancy import EventSink

__all__ = ["run_demo"]

_TICK = 0.25
_REPLICA_START_TIMEOUT = 30.0
_SHUTDOWN_GRACE = 3.0
"""The replicas' FAIRPOST_SHUTDOWN_GRACE; they get a few seconds more before SIGKILL."""
_AWS_ENDPOINT_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_SESV2")
_EMULATOR_REGION = "us-east-1"
_WEBHOOK_SETTLE_SECONDS = 20.0
"""After the drain, at most this long for the webhook deliveries still pending."""


@dataclass
class Backends:
    """Where the demo's Redis and AWS are, and what it must undo there."""

    redis_url: str
    key_prefix: str
    queue_name: str
    aws_env: dict[str, str]
    """Variables the replicas get on top of the demo's own environment."""
    aws_drop: tuple[str, ...]
    """Variables the replicas must not inherit (the user's real AWS profile)."""
    ses_endpoint: str | None
    private_redis: bool
    private_aws: bool
    cleanups: list[str] = field(default_factory=list)
    ses_server: SesServer | None = None
    """On the demo's own emulators: the recording SES server, which counts what SES
    accepted and, in a bouncing scenario, publishes each bounce to :attr:`events_queue`."""
    events_queue: str | None = None

    def boto3_client(self, service: str) -> Any:
        import boto3

        env = {**os.environ, **self.aws_env}
        if not self.private_aws:
            return boto3.client(service)
        return boto3.client(
            service,
            endpoint_url=env[f"AWS_ENDPOINT_URL_{service.upper()}"],
            region_name=env["AWS_DEFAULT_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )


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
            backends = _backends(settings, workdir, stack, console)
            if scenario.ses_events():
                _start_ses_events(backends, stack, console)
            demo_settings, config_file = _demo_settings(backends, scenario, workdir)
            _init_aws(backends, demo_settings)
            stack.callback(_undo, backends, demo_settings)
            receiver = None
            if scenario.webhook_tenants():
                receiver = Receiver().start()
                stack.callback(receiver.stop)
                _add_endpoints(receiver, scenario, demo_settings, console)
            env = demo_env(os.environ, config_file, backends.aws_env)
            for name in backends.aws_drop:
                env.pop(name, None)
            demo = Demo(console, scenario, demo_settings, backends, replicas, workdir, env, output, receiver)
            return asyncio.run(demo.run())
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- set-up ------------------------------------------------------------------------


def _backends(settings: Settings, workdir: Path, stack: contextlib.ExitStack, console: Console) -> Backends:
    run_id = uuid.uuid4().hex[:8]
    if "redis_url" in settings.model_fields_set:
        # Someone else's Redis: keys under a prefix of our own, deleted at the end.
        redis_url, prefix, private_redis = settings.redis_url, f"fairpost-demo-{run_id}", False
        console.print(f"  Redis: {settings.redacted()['redis_url']} (FAIRPOST_REDIS_URL), keys {{{prefix}}}")
    else:
        proc, redis_url = start_redis(workdir)
        stack.callback(proc.stop)
        prefix, private_redis = "fairpost", True
        console.print(f"  Redis: private redis-server on {redis_url}")

    configured = [name for name in _AWS_ENDPOINT_VARS if os.environ.get(name)]
    if configured:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_SESV2") or os.environ.get("AWS_ENDPOINT_URL")
        console.print(f"  AWS: {', '.join(configured)} from the environment")
        return Backends(
            redis_url=redis_url,
            key_prefix=prefix,
            queue_name=f"fairpost-demo-{run_id}.fifo",
            aws_env={},
            aws_drop=(),
            ses_endpoint=endpoint,
            private_redis=private_redis,
            private_aws=False,
        )
    # fairpost's own emulators: an SQS that keeps AWS's FIFO rules without spinning a
    # core (moto's long poll rescans its queue and starves the replicas: the noisy
    # tenant got 78 % of its quota and quiet tenants a p99 of over a second), and the
    # recording SES server, which counts what SES accepted.
    proc, sqs_url = start_fifo_sqs(workdir)
    stack.callback(proc.stop)
    ses = SesServer().start()
    stack.callback(ses.stop)
    console.print(f"  AWS: private SQS on {sqs_url}, recording SES on {ses.url}")
    return Backends(
        redis_url=redis_url,
        key_prefix=prefix,
        queue_name="fairpost-demo.fifo",
        aws_env={
            "AWS_ENDPOINT_URL_SQS": sqs_url,
            "AWS_ENDPOINT_URL_SESV2": ses.url,
            "AWS_DEFAULT_REGION": _EMULATOR_REGION,
            "AWS_ACCESS_KEY_ID": "demo",
            "AWS_SECRET_ACCESS_KEY": "demo",
        },
        # Nothing of a real AWS account may reach the replicas talking to the emulators.
        aws_drop=("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"),
        ses_endpoint=ses.url,
        private_redis=private_redis,
        private_aws=True,
        ses_server=ses,
    )


def _start_ses_events(backends: Backends, stack: contextlib.ExitStack, console: Console) -> None:
    """SES events for a bouncing scenario: the recording SES server (its mailbox simulator
    bounces ``bounce+...@simulator.amazonses.com``) publishes them, SNS-wrapped, to an
    events queue on the demo's SQS, which the replicas read."""
    if backends.ses_server is None:
        console.print("  [yellow]bounces are simulated only on the demo's own emulators: none here[/]")
        return
    backends.events_queue = "fairpost-demo-events"
    console.print(f"  SES: its events to SQS {backends.events_queue}")


def _demo_settings(backends: Backends, scenario: Scenario, workdir: Path) -> tuple[Settings, Path]:
    """The settings every replica runs with, and the TOML file that carries them."""
    config: dict[str, Any] = {
        "redis_url": backends.redis_url,
        "key_prefix": backends.key_prefix,
        "queue_name": backends.queue_name,
        **scenario.config(),
        **({"events_queue_name": backends.events_queue} if backends.events_queue else {}),
        "shutdown_grace": _SHUTDOWN_GRACE,
        "log_level": "INFO",
        "sender": {
            # Paused groups wake within 50 ms of their quota freeing: at per-second
            # quotas, the default jitter of up to 1 s would leave visible gaps.
            "max_jitter_seconds": 0.05,
            # A replica told to stop lets its current long poll end: short polls
            # let the demo's replicas stop in about a second, not the whole grace.
            "wait_seconds": 2,
        },
    }
    path = workdir / "fairpost.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    return Settings(**config), path


def to_toml(data: Mapping[str, Any], table: str = "") -> str:
    """A TOML document of strings, numbers, booleans and nested tables."""
    lines = []
    tables = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    header = f"[{table}]\n" if table and (lines or not tables) else ""
    text = header + "".join(line + "\n" for line in lines)
    for key, value in tables:
        text += ("\n" if text else "") + to_toml(value, f"{table}.{key}" if table else key)
    return text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _init_aws(backends: Backends, settings: Settings) -> None:
    from botocore.exceptions import ClientError

    from fairpost.mailer.ops.queue_setup import init_events_queue, init_queue

    with contextlib.closing(backends.boto3_client("sqs")) as sqs:
        init_queue(sqs, settings)
        if backends.ses_server is not None and backends.events_queue is not None:
            url, _ = init_events_queue(sqs, settings)
            # Its own client: the sink's thread outlives this one.
            backends.ses_server.events = EventSink(backends.boto3_client("sqs"), url, envelope="sns")
    if not backends.private_aws:
        backends.cleanups.append("queue")
    if backends.private_aws:
        return  # the recording SES sends from any identity
    try:
        with contextlib.closing(backends.boto3_client("sesv2")) as ses:
            ses.create_email_identity(EmailIdentity=SENDER_DOMAIN)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "AlreadyExistsException":
            raise


def _add_endpoints(receiver: Receiver, scenario: Scenario, settings: Settings, console: Console) -> None:
    """A webhook endpoint per tenant that asks for one, as ``fairpost webhook add`` makes it."""
    with Webhooks(settings) as hooks:
        for tenant in scenario.webhook_tenants():
            made = hooks.add(tenant, receiver.url(tenant))
            receiver.expect(tenant, made.id, made.secret)
            console.print(f"  webhooks: {tenant}'s outcomes to {receiver.url(tenant)} ({made.id})")


def _undo(backends: Backends, settings: Settings) -> None:
    """Remove what the demo left in services it did not start."""
    if backends.ses_server is not None and backends.ses_server.events is not None:
        backends.ses_server.events.close()
        backends.ses_server.events.sqs.close()
    if "queue" in backends.cleanups:
        with contextlib.suppress(Exception), contextlib.closing(backends.boto3_client("sqs")) as sqs:
            sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=settings.queue_name)["QueueUrl"])
    if not backends.private_redis:
        with contextlib.suppress(redis.RedisError), redis_client(settings) as client:
            keys = list(client.scan_iter(match=MailKeys(settings.key_prefix).root + "*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])


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
        loop = asyncio.get_running_loop()
        started_at = time.monotonic()
        baseline = await asyncio.to_thread(self._ses_counts)
        for i in range(self.replica_count):
            self.replicas.append(start_replica(i + 1, self.workdir, self.env))
        sdk = AsyncMailClient(self.settings, redis_client=client)
        tenants = list(self.scenario.tenants)
        quota = QuotaEngine(client, self.keys)
        error: str | None = None
        with LiveView(self.console, self.scenario, self.replica_count) as view:
            await self._wait_ready(view)
            if self.stop.is_set():
                return 130
            origin_ms = await _redis_ms(client)
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
                    stats = await collect_stats(
                        client, self.keys, self.settings, quota=quota, tenants=tenants
                    )
                    view.update(Phase(name, elapsed, total), stats, self.book)
                    self._trace(elapsed, stats)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), timeout=_TICK)
                    if self.stop.is_set():
                        break
            finally:
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
            end_seconds = loop.time() - started
            if not error and not self.stop.is_set():
                await self._settle_webhooks(client, view)
            view.message(
                "stopping the replicas (SIGTERM; they hand back what they hold)"
                if not error
                else f"[bold red]{error}[/]"
            )
        await self._stop_replicas()
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
        deadline = time.monotonic() + _SHUTDOWN_GRACE + 4
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
