"""``fairpost migrate`` and the key layout's version (dispatcher/layout.py, dispatcher/migrate.py):
locked, idempotent, resumable after a kill, and a dry run that writes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from fairpost.dispatcher.errors import LayoutNotReadable
from fairpost.dispatcher.layout import LAYOUT, MIGRATE_COMMAND, read_layout_sync, verdict
from fairpost.dispatcher.migrate import Migration
from fairpost.dispatcher.replies import text
from fairpost.mailer.cli import main
from fairpost.mailer.sdk.keys import MailKeys

KEYS = MailKeys()
PAYLOAD = '{"from":"a@example.com","to":["b@example.com"]}'


def pre_release_store(client: redis.Redis, count: int) -> list[str]:
    """``count`` records as a pre-release fairpost wrote them: the payload a field of the
    record, no payload key, no layout version. Every tenth carries a TTL."""
    ids = [f"job-{i}" for i in range(count)]
    with client.pipeline(transaction=False) as pipe:
        pipe.sadd(KEYS.tenants(), "acme")
        for i, job_id in enumerate(ids):
            pipe.hset(
                KEYS.job(job_id), mapping={"state": "dead", "tenant": "acme", "payload": f"{PAYLOAD}{i}"}
            )
            if i % 10 == 0:
                pipe.expire(KEYS.job(job_id), 3600)
        pipe.execute()
    return ids


def snapshot(client: redis.Redis) -> dict[str, object]:
    """Every key and what it holds (job records and the tenants set, all there is here)."""
    return {
        text(k): client.hgetall(k) if client.type(k) == "hash" else client.smembers(k)
        for k in client.keys("*")
    }


def assert_migrated(client: redis.Redis, ids: list[str]) -> None:
    with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hexists(KEYS.job(job_id), "payload")
            pipe.get(KEYS.payload(job_id))
            pipe.ttl(KEYS.payload(job_id))
        got = pipe.execute()
    for i, job_id in enumerate(ids):
        in_record, payload, ttl = got[3 * i : 3 * i + 3]
        assert not in_record, job_id
        assert payload == f"{PAYLOAD}{i}", job_id
        assert (ttl > 0) if i % 10 == 0 else (ttl == -1), (job_id, ttl)
    assert client.get(KEYS.layout()) == str(LAYOUT)
    assert client.get(KEYS.migrate_cursor()) is None


def test_a_store_with_no_data_is_stamped_and_one_written_before_versions_is_layout_0(
    redis_client: redis.Redis,
) -> None:
    assert read_layout_sync(redis_client, MailKeys("fresh")) == LAYOUT
    assert redis_client.get(MailKeys("fresh").layout()) == str(LAYOUT)
    pre_release_store(redis_client, 1)
    assert read_layout_sync(redis_client, KEYS) == 0
    assert redis_client.get(KEYS.layout()) is None


def test_a_layout_this_fairpost_cannot_read_is_refused_naming_what_fixes_it() -> None:
    with pytest.raises(LayoutNotReadable, match="a newer fairpost wrote it"):
        verdict(str(LAYOUT + 1))
    # The next release, which reads 1 and 2, on a store never migrated.
    with pytest.raises(LayoutNotReadable, match=f"run `{MIGRATE_COMMAND}`"):
        verdict("", writes=2, reads=(1, 2))
    with pytest.raises(LayoutNotReadable, match="no fairpost writes that"):
        verdict("banana")


def test_the_dry_run_says_what_it_would_do_and_writes_nothing(
    redis_client: redis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pre_release_store(redis_client, 25)
    before = snapshot(redis_client)
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    assert main(["migrate", "--dry-run", "--batch", "7"]) == 0
    out = capsys.readouterr().out
    assert "key layout 0 (unversioned, before 0.1.0) -> 1" in out
    assert "would move 25 legacy payload field(s)" in out
    assert snapshot(redis_client) == before


def test_migrate_moves_every_legacy_payload_and_stamps_the_layout_once(
    redis_client: redis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = pre_release_store(redis_client, 30)
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    assert main(["migrate", "--batch", "4"]) == 0
    assert "moved 30 legacy payload field(s)" in capsys.readouterr().out
    assert_migrated(redis_client, ids)
    assert main(["migrate"]) == 0  # again: nothing to do
    assert capsys.readouterr().out == f"key layout {LAYOUT}: nothing to do\n"
    assert_migrated(redis_client, ids)


def test_two_migrations_at_once_do_no_harm(redis_client: redis.Redis) -> None:
    ids = pre_release_store(redis_client, 200)
    said: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def migrate(i: int) -> None:
        try:
            Migration(redis_client, KEYS, say=said[i].append, batch=5).run(wait_seconds=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    # One did the work; the other waited for its lock, then found nothing to do.
    assert sorted(len(s) for s in said) == [1, 2], said
    assert [f"key layout {LAYOUT}: nothing to do"] in said
    assert_migrated(redis_client, ids)


def test_a_migration_killed_mid_run_resumes_where_it_stood(redis_client: redis.Redis, redis_url: str) -> None:
    ids = pre_release_store(redis_client, 3000)
    env = {**os.environ, "FAIRPOST_REDIS_URL": redis_url}
    cmd = [sys.executable, "-m", "fairpost.mailer.cli", "migrate", "--batch", "10"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while redis_client.get(KEYS.migrate_cursor()) is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the migration saved no progress"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    left = sum(1 for job_id in ids if redis_client.hexists(KEYS.job(job_id), "payload"))
    assert 0 < left < len(ids), f"killed before or after the run, not in it: {left} left"
    assert redis_client.get(KEYS.layout()) is None
    # The lock a killed migration held frees with its TTL; here, as an operator would
    # after a kill they know of, it is deleted.
    redis_client.delete(KEYS.migrate_lock())
    said: list[str] = []
    assert Migration(redis_client, KEYS, say=said.append, batch=10).run() == left
    assert said[0].startswith("resuming at scan cursor")
    assert_migrated(redis_client, ids)


@pytest.mark.parametrize(
    ("stamped", "says"),
    [(str(LAYOUT + 1), "a newer fairpost wrote it"), ("banana", "no fairpost writes that")],
)
def test_a_daemon_refuses_to_start_on_a_layout_it_cannot_read(
    redis_client: redis.Redis, redis_url: str, stamped: str, says: str
) -> None:
    redis_client.set(KEYS.layout(), stamped)
    env = {**os.environ, "FAIRPOST_REDIS_URL": redis_url}
    cmd = [sys.executable, "-m", "fairpost.mailer.cli", "run"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert "fairpost: the Redis key layout is version " in done.stderr
    assert says in done.stderr
    assert redis_client.get(KEYS.layout()) == stamped  # nothing written, nothing started
    assert not redis_client.keys(KEYS.heartbeat("*"))
