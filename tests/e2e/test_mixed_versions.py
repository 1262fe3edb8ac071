"""This checkout beside the previous release (tests/support/release.py): daemons and
SDKs of both on one Redis and one FIFO queue (fairpost's own SQS emulator, which
keeps AWS's FIFO rules), as a rolling upgrade has them for minutes.

Each run must lose nothing, send nothing twice and keep every window, checked
at the recording SES: the previous daemon with this SDK, this daemon with the
previous SDK, and replicas replaced one at a time while mail flows, with jobs
waiting in Redis and in SQS across each swap. Until main moves past 0.1.0 the
previous release is 0.1.0 itself: the machinery is still tested.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fairpost import MailClient
from fairpost.config import Settings
from fairpost.dispatcher.keys import TOTAL_WAITING
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.sqs_server import SqsServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.daemon_process import daemon_process
from tests.support.release import Release, build_release, previous_release
from tests.support.replicas import (
    application_settings,
    mail,
    make_queue,
    replica_env,
    replicas,
    settled,
    stop_cleanly,
)

pytestmark = pytest.mark.slow

GLOBAL, TENANT = 20, 5
TENANTS = ("t1", "t2", "t3")


@pytest.fixture(scope="module")
def previous() -> Release:
    return build_release(*previous_release())


@pytest.fixture
def shared(
    redis_url: str, fifo_sqs_srv: SqsServer, ses: SesServer, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, str], Settings]:
    """The replicas' environment and the application's settings: one Redis, one queue."""
    env = replica_env(
        ses_url=ses.url,
        sqs_url=fifo_sqs_srv.url,
        fairpost={
            "FAIRPOST_REDIS_URL": redis_url,
            "FAIRPOST_QUEUE_NAME": f"mixed-{uuid.uuid4().hex[:8]}.fifo",
            "FAIRPOST_GLOBAL_LIMITS": f"{GLOBAL}/second",
            "FAIRPOST_TENANT_LIMITS": f"{TENANT}/second",
            "FAIRPOST_INFLIGHT_CAP": "3",
            "FAIRPOST_SENDER__WAIT_SECONDS": "1",
            "FAIRPOST_SHUTDOWN_GRACE": "3",
        },
    )
    settings = application_settings(env, monkeypatch)
    make_queue(settings, fifo_sqs_srv.url)
    return env, settings


def load(start: int, per_tenant: int) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(t, [mail(t, n) for n in range(start, start + per_tenant)]) for t in TENANTS]


def send(client: MailClient, spec: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    return [job for tenant, mails in spec for job in client.send_many(tenant, mails)]


def assert_each_sent_once_within_every_window(ses: SesServer, client: MailClient, ids: list[str]) -> None:
    assert all(client.status(i).state == "sent" for i in ids), "a mail ended other than sent"
    delivered = collections.Counter(m.job_id for m in ses.sent)
    assert set(delivered) == set(ids), "lost or unknown mail"
    assert max(delivered.values()) == 1, "a mail was delivered twice"
    assert ses.max_in_window(1.0) <= GLOBAL
    by_tenant = ses.max_in_window_by(1.0, key=lambda m: m.tag("fairpost-tenant"))
    assert max(by_tenant.values()) <= TENANT, by_tenant


def test_the_previous_daemon_sends_what_this_sdk_enqueues(
    previous: Release, shared: tuple[dict[str, str], Settings], ses: SesServer, tmp_path: Path
) -> None:
    env, settings = shared
    with replicas(env, tmp_path, python=previous.python) as daemons, MailClient(settings) as client:
        ids = send(client, load(0, 12))
        wait_for(settled(client, ids), within=60, what="every mail settled")
        stop_cleanly(daemons)
        assert_each_sent_once_within_every_window(ses, client, ids)


def test_this_daemon_sends_what_the_previous_sdk_enqueues(
    previous: Release, shared: tuple[dict[str, str], Settings], ses: SesServer, tmp_path: Path
) -> None:
    env, settings = shared
    with replicas(env, tmp_path) as daemons, MailClient(settings) as client:
        ids = previous.send(env, load(0, 12))
        wait_for(settled(client, ids), within=60, what="every mail settled")
        stop_cleanly(daemons)
        assert_each_sent_once_within_every_window(ses, client, ids)


@contextlib.contextmanager
def flowing(settings: Settings, previous: Release, env: dict[str, str]) -> Iterator[list[str]]:
    """A mail a tenant every 0.3 s, within its quota, from this SDK and the previous one
    in turn, until the block ends; the ids so far."""
    ids: list[str] = []
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        batch = 0
        try:
            with MailClient(settings) as client:
                while not stop.wait(0.3):
                    spec = load(1000 + batch, 1)
                    ids.extend(previous.send(env, spec) if batch % 2 else send(client, spec))
                    batch += 1
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="load")
    thread.start()
    try:
        yield ids
    finally:
        stop.set()
        thread.join(60)
    assert not failed, failed


def test_a_rolling_replacement_under_load_loses_nothing_and_sends_nothing_twice(
    previous: Release, shared: tuple[dict[str, str], Settings], ses: SesServer, tmp_path: Path
) -> None:
    env, settings = shared
    keys = MailKeys(settings.key_prefix)
    watch = redis.Redis.from_url(env["FAIRPOST_REDIS_URL"], decode_responses=True)

    def in_redis_and_in_sqs() -> bool:
        waiting = int(watch.hget(keys.counts(), TOTAL_WAITING) or 0)
        # Jobs in the dispatched index (the anchor, scored +inf, left out).
        return waiting > 0 and watch.zcount(keys.dispatched(), "-inf", "(inf") > 0

    bursts: list[str] = []
    with contextlib.ExitStack() as stack, MailClient(settings) as client:
        stack.callback(watch.close)
        olds = [
            stack.enter_context(daemon_process(env, tmp_path, replica=f"old{i}", python=previous.python))
            for i in (1, 2)
        ]
        news = []
        with flowing(settings, previous, env) as ids:
            for i, old in enumerate(olds, 1):
                # A burst over the tenants' quota: jobs wait in Redis behind those in SQS.
                bursts += send(client, load(100 * i, 12))
                wait_for(in_redis_and_in_sqs, within=30, what="jobs waiting in Redis and in SQS")
                assert old.stop() == 0, old.logs()
                news.append(stack.enter_context(daemon_process(env, tmp_path, replica=f"new{i}")))
        every = [*bursts, *ids]
        wait_for(settled(client, every), within=90, what="every mail settled")
        stop_cleanly(news)
        assert_each_sent_once_within_every_window(ses, client, every)
