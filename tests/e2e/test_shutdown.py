"""Two-phase shutdown with real signals on real daemon processes (issue 4, item 1).

SIGTERM or SIGINT: the daemon stops receiving and claiming, lets in-flight
SES sends finish within FAIRPOST_SHUTDOWN_GRACE, then hands back what it
still holds (received messages get visibility 0, claims go back to their
queues) and exits 0; another replica then delivers the mail at once, not
after the 60 s visibility timeout. A second signal exits at once. A daemon
whose background task dies exits non-zero.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis

from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.cli import main
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import redis_server
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support import JOB_SCORES
from tests.support.daemon_process import daemon_process

pytestmark = pytest.mark.slow

PREFIX = "stop"
KEYS = MailKeys(PREFIX)
GRACE = 1.5
# Startup of the hand-back, closing clients, interpreter exit: well under a second here.
MARGIN = 3.0
VISIBILITY_TIMEOUT = 60.0
QUEUE = "fairpost-mail.fifo"


@pytest.fixture
def base_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, aws_env: str) -> Iterator[dict[str, str]]:
    for name, value in {
        "FAIRPOST_REDIS_URL": redis_url,
        "FAIRPOST_KEY_PREFIX": PREFIX,
        "FAIRPOST_SENDER__WAIT_SECONDS": "1",
        "FAIRPOST_SENDER__VISIBILITY_TIMEOUT": str(int(VISIBILITY_TIMEOUT)),
        "FAIRPOST_SHUTDOWN_GRACE": str(GRACE),
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["init-aws"]) == 0
    yield dict(os.environ)


def with_ses(env: dict[str, str], ses: SesServer) -> dict[str, str]:
    return {**env, "AWS_ENDPOINT_URL_SESV2": ses.url}


def waiting(sqs: Any, url: str) -> int:
    """Messages in the queue that no receiver holds."""
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


def send(client: MailClient, tenants: list[str]) -> list[str]:
    return [
        client.send(t, sender="app@example.com", to=["ada@example.org"], subject="hi", text="hello")
        for t in tenants
    ]


def test_sigterm_hands_received_mail_to_another_replica_within_seconds(
    base_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    tenants = [f"t{i}" for i in range(5)]
    # Replica a sends one mail at a time and its SES takes 30 s to answer: a
    # SIGTERM finds one mail mid-call and four received, waiting their turn.
    env_a = {**base_env, "FAIRPOST_SENDER__CONCURRENCY": "1", "FAIRPOST_SENDER__RECEIVERS": "1"}
    sqs = boto3.client("sqs")
    url = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    with MailClient() as client:
        job_ids = send(client, tenants)
    # All five in SQS first, so that replica a's first receive takes them all.
    with daemon_process(base_env, tmp_path, replica="d", role="dispatcher") as dispatcher:
        wait_for(lambda: waiting(sqs, url) == len(tenants), within=15, what="the mail in SQS")
        assert dispatcher.stop() == 0
    with (
        SesServer(latency=30) as slow,
        SesServer() as fast,
        daemon_process(with_ses(env_a, slow), tmp_path, replica="a", role="sender") as a,
    ):
        slow.wait_for(1, timeout=20)
        assert waiting(sqs, url) == 0, "replica a holds all five"
        with daemon_process(with_ses(base_env, fast), tmp_path, replica="b"):
            assert fast.sent_count == 0
            started = time.monotonic()
            a.send_signal(signal.SIGTERM)
            assert a.wait(timeout=GRACE + MARGIN) == 0, a.logs()
            stopped = time.monotonic() - started
            assert stopped >= GRACE * 0.9, "the send in flight got its grace period"
            # The four that never reached SES go back at once. The one cut off
            # mid-call may have reached SES: it is left to its visibility timeout.
            assert a.logged("handed 4 received messages back to SQS"), a.logs()

            delivered = fast.wait_for(4, timeout=15)
            took = time.monotonic() - started
            assert took < VISIBILITY_TIMEOUT / 4, f"delivered {took:.1f}s after SIGTERM"
            in_call = slow.sent[0].job_id
            others = [j for j in job_ids if j != in_call]
            assert sorted(m.job_id or "" for m in delivered) == sorted(others)
            wait_for(
                lambda: all(redis_client.hget(KEYS.job(j), "state") == JobState.SENT.value for j in others),
                within=5,
                what="the four jobs to be recorded as sent by replica b",
            )
            assert fast.sent_count == 4, "the mail cut off mid-call was not sent again at once"


def test_a_second_signal_exits_at_once(base_env: dict[str, str], tmp_path: Path) -> None:
    with SesServer(latency=30) as slow, MailClient() as client:
        # A long grace: only the second signal can end this daemon quickly.
        env = {**with_ses(base_env, slow), "FAIRPOST_SHUTDOWN_GRACE": "60"}
        with daemon_process(env, tmp_path, replica="twice") as daemon:
            send(client, ["acme"])
            slow.wait_for(1, timeout=20)
            daemon.send_signal(signal.SIGINT)
            wait_for(lambda: daemon.logged("signal received"), within=5, what="the first signal")
            started = time.monotonic()
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=3)
            assert time.monotonic() - started < 2
            assert code != 0
            assert daemon.logged("second signal: exiting at once")


class _HangingSqs:
    """A proxy in front of moto that passes every SQS call through except
    SendMessageBatch, which it holds until released: a dispatcher stuck mid
    hand-off, holding its claims."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.release = threading.Event()
        self.held = threading.Semaphore(0)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                target = self.headers.get("X-Amz-Target", "") + body.decode("utf-8", "replace")[:200]
                if "SendMessageBatch" in target:
                    proxy.held.release()
                    proxy.release.wait(60)
                    with contextlib.suppress(OSError):  # the daemon gave up and closed
                        self.send_error(503)
                    return
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
                }
                request = urllib.request.Request(
                    proxy.upstream + self.path, data=body, headers=headers, method="POST"
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, data, kind = response.status, response.read(), response.headers
                except urllib.error.HTTPError as exc:
                    status, data, kind = exc.code, exc.read(), exc.headers
                self.send_response(status)
                self.send_header("Content-Type", kind.get("Content-Type", "application/x-amz-json-1.0"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _HangingSqs:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_sigterm_returns_the_dispatchers_claims_to_their_queues(
    base_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    with _HangingSqs(base_env["AWS_ENDPOINT_URL"]) as sqs, MailClient() as client:
        env = {**base_env, "AWS_ENDPOINT_URL_SQS": sqs.url}
        with daemon_process(env, tmp_path, replica="disp", role="dispatcher") as daemon:
            job_ids = send(client, ["acme", "acme", "beta"])
            assert sqs.held.acquire(timeout=15), "the dispatcher never tried to hand off"
            wait_for(lambda: redis_client.zcount(KEYS.leases(), *JOB_SCORES) == 3, within=5, what="3 claims")
            started = time.monotonic()
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=GRACE + MARGIN) == 0, daemon.logs()
            assert time.monotonic() - started < GRACE + MARGIN
        # Back in their queues at once, not when the 30 s leases run out.
        assert redis_client.zcard(KEYS.leases()) == 0
        states = {redis_client.hget(KEYS.job(j), "state") for j in job_ids}
        assert states == {JobState.QUEUED.value}
        assert redis_client.llen(KEYS.queue("acme", "normal")) == 2
        assert redis_client.llen(KEYS.queue("beta", "normal")) == 1
        assert daemon.logged("returned 3 claimed jobs to their queues")


def test_a_daemon_whose_task_dies_exits_non_zero(base_env: dict[str, str], tmp_path: Path) -> None:
    # Its own redis-server, to kill it without touching the other tests' one.
    with redis_server() as own_redis, SesServer() as ses:
        env = {
            **with_ses(base_env, ses),
            "FAIRPOST_REDIS_URL": own_redis.url(),
            "FAIRPOST_MAX_OUTAGE_SECONDS": "3",
        }
        with daemon_process(env, tmp_path, replica="doomed") as daemon:
            own_redis.process.terminate()
            own_redis.process.wait(timeout=10)
            code = daemon.wait(timeout=30)
            assert code != 0, daemon.logs()
            assert daemon.logged("stopped unexpectedly"), daemon.logs()
