"""``fairpost run`` and the SDK on redis-servers started with ``--maxmemory`` and each
``--maxmemory-policy`` (issue 37), as managed services run them:

- ``allkeys-lru``: the daemon refuses to start, naming the setting and the fix;
- ``noeviction``, Redis full: the daemon starts, drains what is queued and records
  every send once; then the SDK takes mail again;
- ``volatile-lru``, a backlog larger than memory: nothing lost, nothing sent twice,
  every window kept, and Redis never evicts (admission control: docs/design.md).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import redis

from fairpost.config import load_settings
from fairpost.dispatcher.errors import RedisNearlyFull
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.redis_memory import read_memory
from fairpost.mailer.cli import main
from fairpost.mailer.errors import RedisFailed
from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.daemon_process import daemon_process
from tests.support.memory import MAXMEMORY, LimitedRedis, fill_to

pytestmark = pytest.mark.slow

PREFIX = "mem"
KEYS = MailKeys(PREFIX)
BODY = "x" * 16_000
"""Mail of 16 KB: a few hundred fill the 4 MB Redis, so the daemon drains it in seconds."""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, aws_env: str, ses: SesServer) -> Iterator[dict[str, str]]:
    for name, value in {
        "FAIRPOST_KEY_PREFIX": PREFIX,
        "FAIRPOST_SENDER__WAIT_SECONDS": "1",
        "FAIRPOST_GLOBAL_LIMITS": "1000/second",
        "FAIRPOST_TENANT_LIMITS": "1000/second",
        "FAIRPOST_MAX_OUTAGE_SECONDS": "5",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["init-aws"]) == 0
    yield {**os.environ, "AWS_ENDPOINT_URL_SESV2": ses.url}


def mail(i: int) -> dict[str, object]:
    return {"sender": "app@example.com", "to": ["ada@example.org"], "subject": f"m{i}", "text": BODY}


def gauge(text: str, series: str) -> float:
    """A series' value in a /metrics page."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert found is not None, f"{series} not on /metrics"
    return float(found[1])


def all_sent(client: redis.Redis, job_ids: list[str]) -> bool:
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(KEYS.job(job_id), "state")
        return all(state == JobState.SENT.value.encode() for state in pipe.execute())


def test_run_refuses_allkeys_lru_by_name(
    env: dict[str, str], limited_redis_srv: LimitedRedis, tmp_path: Path
) -> None:
    url = limited_redis_srv.url("allkeys-lru")
    env = {**env, "FAIRPOST_REDIS_URL": url}
    with daemon_process(env, tmp_path, replica="r", wait_ready=False) as daemon:
        code = daemon.wait(timeout=30)
    assert code != 0
    assert "maxmemory-policy is allkeys-lru" in daemon.logs()
    assert "noeviction" in daemon.logs()


def test_the_daemon_shows_redis_memory_and_stops_when_the_policy_turns_to_allkeys(
    env: dict[str, str], limited_redis_srv: LimitedRedis, tmp_path: Path
) -> None:
    url = limited_redis_srv.url("noeviction")
    port = free_port()
    env = {**env, "FAIRPOST_REDIS_URL": url, "FAIRPOST_REDIS_MEMORY_CHECK_SECONDS": "1"}
    with daemon_process(env, tmp_path, replica="r", http_port=port) as daemon:
        status, text = daemon.get("/metrics")
        assert status == 200
        assert gauge(text, "fairpost_redis_maxmemory_bytes") == MAXMEMORY
        assert gauge(text, 'fairpost_redis_maxmemory_policy{policy="noeviction"}') == 1
        assert gauge(text, "fairpost_redis_evicted_keys") == 0
        assert gauge(text, "fairpost_redis_high_water_ratio") == 0.85
        assert 0 < gauge(text, "fairpost_redis_used_memory_bytes") < MAXMEMORY
        with redis.Redis.from_url(url) as plain:
            plain.config_set("maxmemory-policy", "allkeys-lru")  # changed under the running daemon
        code = daemon.wait(timeout=30)
    assert code != 0
    assert "maxmemory-policy is allkeys-lru" in daemon.logs()


def test_a_daemon_started_on_a_full_noeviction_redis_drains_it_and_records_every_send(
    env: dict[str, str], limited_redis_srv: LimitedRedis, ses: SesServer, tmp_path: Path
) -> None:
    url = limited_redis_srv.url("noeviction")
    job_ids: list[str] = []
    # Filled before fairpost guarded it (an older version, a neighbour): past any
    # high-water mark, to the limit itself.
    with MailClient(load_settings(redis_url=url, key_prefix=PREFIX, redis_high_water=1.0)) as client:
        while True:
            try:
                job_ids.append(client.send(f"t{len(job_ids) % 3}", **mail(len(job_ids))))  # type: ignore[arg-type]
            except RedisFailed as exc:
                assert "OutOfMemoryError" in str(exc)
                break
    with redis.Redis.from_url(url) as plain:
        fill_to(plain, 1.0)  # the last bytes, by a neighbour: full
        assert read_memory(plain).used_memory >= read_memory(plain).maxmemory
        with daemon_process({**env, "FAIRPOST_REDIS_URL": url}, tmp_path, replica="r") as daemon:
            ses.wait_for(len(job_ids), timeout=60)
            wait_for(lambda: all_sent(plain, job_ids), within=30, what="every send recorded")
            # Room again: the SDK with its default high-water mark takes mail.
            with MailClient(load_settings(redis_url=url, key_prefix=PREFIX)) as client:
                late = client.send("t0", **mail(len(job_ids)))  # type: ignore[arg-type]
            ses.wait_for(len(job_ids) + 1, timeout=30)
            wait_for(lambda: all_sent(plain, [late]), within=30, what="the late mail recorded")
            assert daemon.process.poll() is None, daemon.logs()
    sent = Counter(m.job_id or "" for m in ses.sent)
    assert sorted(sent) == sorted([*job_ids, late])
    assert max(sent.values()) == 1, "no mail sent twice"


def test_a_running_daemon_records_every_send_when_redis_fills_up_under_it(
    env: dict[str, str], limited_redis_srv: LimitedRedis, ses: SesServer, tmp_path: Path
) -> None:
    """The issue's run: Redis fills (a neighbour) while the daemon drains a backlog. It
    used to go on sending without recording (90 sent, 80 recorded), exit after
    FAIRPOST_MAX_OUTAGE_SECONDS and send those again."""
    url = limited_redis_srv.url("noeviction")
    with MailClient(load_settings(redis_url=url, key_prefix=PREFIX)) as client:
        # Small mails, as notifications are: a send frees little of what it recorded.
        job_ids = [client.send("t0", **{**mail(i), "text": "hello"}) for i in range(60)]  # type: ignore[arg-type]
    env = {**env, "FAIRPOST_REDIS_URL": url, "FAIRPOST_TENANT_LIMITS": "10/second"}
    with redis.Redis.from_url(url) as plain, daemon_process(env, tmp_path, replica="r") as daemon:
        ses.wait_for(10, timeout=30)
        # Full while the daemon sends, and well over (a neighbour's keys, and its
        # maxmemory lowered under it): what the daemon's sends free is not enough.
        fill_to(plain, 0.9)
        plain.config_set("maxmemory", int(read_memory(plain).used_memory * 0.9))
        assert read_memory(plain).fill > 1
        assert ses.sent_count < len(job_ids)
        ses.wait_for(len(job_ids), timeout=60)
        wait_for(lambda: all_sent(plain, job_ids), within=30, what="every send recorded")
        assert daemon.process.poll() is None, daemon.logs()
        plain.config_set("maxmemory", MAXMEMORY)  # room again: the limit back, the neighbour gone
        plain.delete(*plain.keys("filler:*"))
        with MailClient(load_settings(redis_url=url, key_prefix=PREFIX)) as client:
            client.send("t0", **{**mail(60), "text": "hello"})  # type: ignore[arg-type]
    sent = Counter(m.job_id or "" for m in ses.sent)
    assert sorted(sent) == sorted(job_ids)
    assert max(sent.values()) == 1, "no mail sent twice"


def test_a_volatile_lru_backlog_larger_than_memory_loses_nothing_and_never_evicts(
    env: dict[str, str], limited_redis_srv: LimitedRedis, ses: SesServer, tmp_path: Path
) -> None:
    url = limited_redis_srv.url("volatile-lru")
    body = "x" * 64_000
    with redis.Redis.from_url(url) as plain:
        # Room for the daemon's own working set beside the 4 MB a fresh Redis uses little of.
        plain.config_set("maxmemory", 16 * 1024 * 1024)
    total = 320  # 320 x 64 KB: half again what the 16 MB Redis holds
    accepted: list[str] = []
    refusals = 0

    def produce() -> None:
        nonlocal refusals
        with MailClient(load_settings(redis_url=url, key_prefix=PREFIX)) as client:
            while len(accepted) < total:
                i = len(accepted)
                try:
                    accepted.append(client.send(f"t{i % 3}", **{**mail(i), "text": body}))  # type: ignore[arg-type]
                except RedisNearlyFull:
                    refusals += 1
                    time.sleep(0.05)  # the application's back-off: the daemon drains meanwhile

    with redis.Redis.from_url(url) as plain:
        producer = threading.Thread(target=produce)
        producer.start()
        wait_for(lambda: refusals > 0, within=30, what="the SDK to reach the high-water mark")
        env = {**env, "FAIRPOST_TENANT_LIMITS": "40/second"}
        with daemon_process({**env, "FAIRPOST_REDIS_URL": url}, tmp_path, replica="r"):
            producer.join(timeout=90)
            assert not producer.is_alive()
            ses.wait_for(total, timeout=60)
            wait_for(lambda: all_sent(plain, accepted), within=30, what="every send recorded")
        assert read_memory(plain).evicted_keys == 0
    sent = Counter(m.job_id or "" for m in ses.sent)
    assert sorted(sent) == sorted(accepted)
    assert max(sent.values()) == 1, "no mail sent twice"
    # Every window kept: no tenant over 40 in any second.
    for tenant in range(3):
        times = sorted(m.monotonic for m in ses.sent if m.subject and int(m.subject[1:]) % 3 == tenant)
        assert all(times[i + 40] - times[i] >= 1.0 for i in range(len(times) - 40)), f"t{tenant}"


def test_ses_events_on_a_full_redis_wait_in_their_queue_and_the_daemon_lives_on(
    env: dict[str, str], limited_redis_srv: LimitedRedis, ses: SesServer, tmp_path: Path
) -> None:
    """SES's events for the mail a full Redis drains cannot be recorded until it has room:
    they wait in their queue, however long Redis stays full, and the daemon, which
    sends what frees the room, lives on (it used to stop after
    FAIRPOST_MAX_OUTAGE_SECONDS of its events task failing, leaving the backlog)."""
    url = limited_redis_srv.url("noeviction")
    events = "fairpost-ses-events-full"
    sqs = boto3.client("sqs")
    events_url, _ = init_events_queue(sqs, load_settings(redis_url=url, events_queue_name=events))
    # An event whose round failed comes back after the queue's visibility timeout: 5 s
    # here rather than init-aws's 60, which this test would otherwise wait out once room
    # is made. What is checked is that the events wait in the queue, not for how long.
    sqs.set_queue_attributes(QueueUrl=events_url, Attributes={"VisibilityTimeout": "5"})
    sink = EventSink(sqs, events_url, envelope="sns")
    ses.events = sink
    with MailClient(load_settings(redis_url=url, key_prefix=PREFIX)) as client:
        # The mailbox simulator's address: SES publishes a delivery event for each.
        simulated = {"to": ["success@simulator.amazonses.com"], "text": "hello"}
        job_ids = [client.send("t0", **{**mail(i), **simulated}) for i in range(40)]  # type: ignore[arg-type]
    env = {**env, "FAIRPOST_REDIS_URL": url, "FAIRPOST_EVENTS_QUEUE_NAME": events}
    try:
        with (
            redis.Redis.from_url(url) as plain,
            daemon_process(env, tmp_path, replica="r", http_port=free_port()) as daemon,
        ):
            ses.wait_for(1, timeout=30)
            fill_to(plain, 0.9)
            plain.config_set("maxmemory", int(read_memory(plain).used_memory * 0.9))
            full_since = time.monotonic()
            ses.wait_for(len(job_ids), timeout=60)
            wait_for(lambda: all_sent(plain, job_ids), within=30, what="every send recorded")

            def failing_longer_than_allowed() -> bool:
                failed = [
                    r for r in daemon.log_records() if "task events step failed" in str(r.get("msg", ""))
                ]
                return len(failed) >= 2 and time.monotonic() - full_since > 2 * 5  # MAX_OUTAGE_SECONDS

            wait_for(
                failing_longer_than_allowed, within=60, what="the events task failing past the outage allowed"
            )
            assert daemon.process.poll() is None, daemon.logs()
            plain.config_set("maxmemory", MAXMEMORY)  # room again: the events recorded
            plain.delete(*plain.keys("filler:*"))

            def delivered() -> int:
                status, text = daemon.get("/metrics")
                found = re.findall(
                    r'^fairpost_ses_events_total\{[^}]*outcome="delivery"[^}]*\} (\S+)$', text, re.M
                )
                return int(sum(float(v) for v in found)) if status == 200 else 0

            wait_for(lambda: delivered() >= len(job_ids), within=60, what="every delivery event recorded")
            assert daemon.process.poll() is None, daemon.logs()
    finally:
        sink.close()
