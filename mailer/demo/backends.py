"""Where the demo's Redis and AWS are: found or started, configured for the replicas,
and left as they were found at the end.

The user's own Redis (``FAIRPOST_REDIS_URL``) and AWS endpoints are used when set,
under names of the demo's own; otherwise a private redis-server, fairpost's SQS
and the recording SES server. The replicas' settings go to a TOML file.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console

from fairpost.config import Settings
from fairpost.dispatcher.connect import redis_client
from fairpost.mailer.demo.load import SENDER_DOMAIN
from fairpost.mailer.demo.scenario import Scenario
from fairpost.mailer.demo.services import start_fifo_sqs, start_redis
from fairpost.mailer.demo.webhooks import Receiver
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import SesServer

__all__ = [
    "SHUTDOWN_GRACE",
    "Backends",
    "add_endpoints",
    "demo_settings",
    "find_backends",
    "init_aws",
    "start_ses_events",
    "to_toml",
    "undo",
]

SHUTDOWN_GRACE = 3.0
"""The replicas' FAIRPOST_SHUTDOWN_GRACE; they get a few seconds more before SIGKILL."""
_AWS_ENDPOINT_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_SESV2")
_EMULATOR_REGION = "us-east-1"


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


def find_backends(
    settings: Settings, workdir: Path, stack: contextlib.ExitStack, console: Console
) -> Backends:
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


def start_ses_events(backends: Backends, stack: contextlib.ExitStack, console: Console) -> None:
    """SES events for a bouncing scenario: the recording SES server (its mailbox simulator
    bounces ``bounce+...@simulator.amazonses.com``) publishes them, SNS-wrapped, to an
    events queue on the demo's SQS, which the replicas read."""
    if backends.ses_server is None:
        console.print("  [yellow]bounces are simulated only on the demo's own emulators: none here[/]")
        return
    backends.events_queue = "fairpost-demo-events"
    console.print(f"  SES: its events to SQS {backends.events_queue}")


def demo_settings(backends: Backends, scenario: Scenario, workdir: Path) -> tuple[Settings, Path]:
    """The settings every replica runs with, and the TOML file that carries them."""
    config: dict[str, Any] = {
        "redis_url": backends.redis_url,
        "key_prefix": backends.key_prefix,
        "queue_name": backends.queue_name,
        **scenario.config(),
        **({"events_queue_name": backends.events_queue} if backends.events_queue else {}),
        "shutdown_grace": SHUTDOWN_GRACE,
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


def init_aws(backends: Backends, settings: Settings) -> None:
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


def add_endpoints(receiver: Receiver, scenario: Scenario, settings: Settings, console: Console) -> None:
    """A webhook endpoint per tenant that asks for one, as ``fairpost webhook add`` makes it."""
    with Webhooks(settings) as hooks:
        for tenant in scenario.webhook_tenants():
            made = hooks.add(tenant, receiver.url(tenant))
            receiver.expect(tenant, made.id, made.secret)
            console.print(f"  webhooks: {tenant}'s outcomes to {receiver.url(tenant)} ({made.id})")


def undo(backends: Backends, settings: Settings) -> None:
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
