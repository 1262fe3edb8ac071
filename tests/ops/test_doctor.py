"""``fairpost doctor`` on each Redis set-up, and on the SQS and SES emulators: every
verdict names the problem it found, and a failure makes the exit status 1 (#37)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fairpost.mailer.cli import main
from fairpost.mailer.ops.redis_acl import acl_setuser
from fairpost.mailer.testing.services import RedisServer, redis_server
from fairpost.mailer.testing.ses_server import SesServer

Checks = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this module's own: its memory settings and users change per test."""
    with redis_server() as server:
        yield server


@pytest.fixture
def admin(own_redis: RedisServer) -> Iterator[redis.Redis]:
    client: redis.Redis = redis.Redis(port=own_redis.port, decode_responses=True)
    client.flushall()
    yield client
    client.config_set("maxmemory", "0")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_resetstat()
    for user in client.acl_users():
        if user != "default":
            client.acl_deluser(str(user))
    client.close()


@pytest.fixture
def env(
    own_redis: RedisServer,
    ses_env: SesServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The daemon's environment on this module's Redis, moto's SQS (the queue made) and the SES server."""
    monkeypatch.setenv("FAIRPOST_REDIS_URL", own_redis.url())
    assert main(["init-aws"]) == 0
    capsys.readouterr()


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Checks]:
    code = main(["doctor", "--json", *args])
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is (code == 0)
    return code, {f"{c['area']} {c['check']}": c for c in report["checks"]}


def test_a_plain_redis_and_healthy_aws_pass_with_warnings_named(
    env: None, admin: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    code, checks = doctor(capsys)
    assert code == 0, checks
    for name in ("redis connection", "redis version", "redis topology", "redis acl", "redis policy",
                 "sqs queue", "ses account", "ses quota"):  # fmt: skip
        assert checks[name]["verdict"] == "pass", checks[name]
    assert checks["redis persistence"]["verdict"] == "warn"
    assert "appendonly is off" in checks["redis persistence"]["detail"]
    assert checks["redis memory"]["verdict"] == "warn"
    assert "no maxmemory" in checks["redis memory"]["detail"]
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "WARN redis persistence: appendonly is off" in text and "fix: appendonly yes" in text


@pytest.mark.parametrize(
    ("policy", "verdict", "code"),
    [("noeviction", "pass", 0), ("volatile-lru", "warn", 0), ("allkeys-lru", "fail", 1)],
)
def test_each_eviction_policy_gets_its_verdict_by_name(
    env: None, admin: redis.Redis, capsys: pytest.CaptureFixture[str], policy: str, verdict: str, code: int
) -> None:
    admin.config_set("maxmemory", str(64 * 2**20))
    admin.config_set("maxmemory-policy", policy)
    exit_code, checks = doctor(capsys, "--redis-only")
    assert exit_code == code
    assert checks["redis policy"]["verdict"] == verdict, checks["redis policy"]
    assert policy in checks["redis policy"]["detail"]
    assert checks["redis memory"]["verdict"] == "pass"
    assert "of 64.0 MiB" in checks["redis memory"]["detail"]
    if verdict != "pass":
        assert checks["redis policy"]["fix"]


def test_keys_evicted_already_fail_by_count(
    env: None, admin: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.config_set("maxmemory", str(2 * 2**20))
    admin.config_set("maxmemory-policy", "allkeys-random")
    with admin.pipeline(transaction=False) as pipe:
        for i in range(4000):
            pipe.set(f"cache:{i}", "x" * 1024)
        pipe.execute()
    exit_code, checks = doctor(capsys, "--redis-only")
    assert exit_code == 1
    assert checks["redis memory"]["verdict"] == "fail"
    assert "evicted" in checks["redis memory"]["detail"]


def test_a_user_built_from_the_template_passes_and_one_lacking_a_command_fails_naming_it(
    env: None, admin: redis.Redis, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    admin.execute_command(  # type: ignore[no-untyped-call]
        *acl_setuser("fp", password="pw").split()
    )
    monkeypatch.setenv("FAIRPOST_REDIS_URL", f"redis://fp:pw@127.0.0.1:{own_redis.port}/0")
    code, checks = doctor(capsys, "--redis-only")
    assert checks["redis acl"]["verdict"] == "pass", checks["redis acl"]
    assert code == 0
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "fp", "-lmpop", "-xautoclaim"
    )
    code, checks = doctor(capsys, "--redis-only")
    assert code == 1
    acl = checks["redis acl"]
    assert acl["verdict"] == "fail"
    assert "lmpop" in acl["detail"] and "xautoclaim" in acl["detail"]
    assert "ACL SETUSER fp +lmpop +xautoclaim" in acl["fix"]
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "fp", "resetkeys", "~elsewhere:*"
    )
    code, checks = doctor(capsys, "--redis-only")
    assert checks["redis acl"]["verdict"] == "fail"
    assert "keys" in checks["redis acl"]["detail"]


def test_a_wrong_password_fails_the_connection_naming_the_setting(
    env: None, admin: redis.Redis, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    admin.execute_command(  # type: ignore[no-untyped-call]
        *acl_setuser("fp", password="right-one").split()
    )
    monkeypatch.setenv("FAIRPOST_REDIS_URL", f"redis://fp:wrong-one@127.0.0.1:{own_redis.port}/0")
    code, checks = doctor(capsys, "--redis-only")
    assert code == 1
    connection = checks["redis connection"]
    assert connection["verdict"] == "fail" and "WRONGPASS" in connection["detail"]
    assert "FAIRPOST_REDIS_URL" in connection["fix"]
    assert "wrong-one" not in json.dumps(checks) and "right-one" not in json.dumps(checks)


def test_a_missing_queue_and_a_paused_ses_account_fail_by_name(
    env: None, admin: redis.Redis, ses_env: SesServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("FAIRPOST_QUEUE_NAME", "nowhere.fifo")
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "500/second")
    ses_env.pause()
    code, checks = doctor(capsys)
    assert code == 1
    assert checks["sqs queue"]["verdict"] == "fail"
    assert "nowhere.fifo does not exist" in checks["sqs queue"]["detail"]
    assert "init-aws" in checks["sqs queue"]["fix"]
    assert checks["ses account"]["verdict"] == "fail"
    assert "sending is disabled" in checks["ses account"]["detail"]
    assert checks["ses quota"]["verdict"] == "warn"
    assert "500 per 1 s" in checks["ses quota"]["detail"]


def test_a_redis_above_the_high_water_mark_warns_that_new_mail_is_refused(
    env: None, admin: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", str(int(used * 1.05)))  # noeviction: full, never evicting
    exit_code, checks = doctor(capsys, "--redis-only")
    assert exit_code == 0
    memory = checks["redis memory"]
    assert memory["verdict"] == "warn" and "new mail is refused" in memory["detail"]
    assert checks["redis policy"]["verdict"] == "pass"
