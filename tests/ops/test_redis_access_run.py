"""``fairpost run`` on a Redis that refuses its credentials or a command: it exits at
once, naming the setting, instead of riding out an "outage" that is its configuration (#37)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from tests.support.daemon_process import daemon_process

SECRET = "s3cret-pass-word"


@pytest.mark.parametrize(
    ("userinfo", "code"),
    [
        pytest.param("run37:wrong-password", "WRONGPASS", id="wrongpass"),
        pytest.param(f"run37noscript:{SECRET}", "NOPERM", id="noperm"),
    ],
)
def test_fairpost_run_exits_at_once_naming_the_setting(
    ops_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path, userinfo: str, code: str
) -> None:
    redis_client.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "run37", "on", f">{SECRET}", "~*", "&*", "+@all"
    )
    redis_client.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "run37noscript", "on", f">{SECRET}", "~*", "&*", "+@all", "-@scripting"
    )
    try:
        env = dict(ops_env)
        env["FAIRPOST_REDIS_URL"] = ops_env["FAIRPOST_REDIS_URL"].replace("redis://", f"redis://{userinfo}@")
        env["FAIRPOST_MAX_OUTAGE_SECONDS"] = "600"  # an outage would be ridden out for ten minutes
        started = time.monotonic()
        with daemon_process(env, tmp_path, replica="refused", wait_ready=False) as daemon:
            assert daemon.wait(timeout=30) != 0
            took = time.monotonic() - started
            logs = daemon.logs()
        assert took < 30
        assert "FAIRPOST_REDIS_URL" in logs and code in logs, logs
        assert SECRET not in logs and "wrong-password" not in logs, logs
    finally:
        redis_client.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "DELUSER", "run37", "run37noscript"
        )
