"""The ACL template of docs/operations.md ("Redis in production") is exactly enough:
fairpost runs under a user built from it without one refusal, and Redis counts no
command outside it (#37)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from fairpost import AsyncMailClient, MailClient
from fairpost.config import load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.ops.redis_acl import COMMANDS, acl_setuser
from fairpost.mailer.quota.overrides import QuotaAdmin
from fairpost.mailer.testing.services import RedisServer, redis_server
from fairpost.mailer.testing.ses_server import SesServer
from tests.support.daemon_process import daemon_process

MAIL: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}


@pytest.fixture
def template_redis() -> Iterator[tuple[RedisServer, redis.Redis]]:
    """A redis-server of its own, with the user ``fairpost`` made by the template."""
    with redis_server() as server:
        admin: redis.Redis = redis.Redis(port=server.port, decode_responses=True)
        admin.execute_command(*acl_setuser("fairpost", "fairpost", "tmpl-pw").split())  # type: ignore[no-untyped-call]
        yield server, admin
        admin.close()


def test_fairpost_runs_under_the_template_user_and_uses_no_other_command(
    template_redis: tuple[RedisServer, redis.Redis],
    ses_env: SesServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, admin = template_redis
    url = f"redis://fairpost:tmpl-pw@127.0.0.1:{server.port}/0"
    for name, value in {
        "FAIRPOST_REDIS_URL": url,
        "FAIRPOST_SENDER__WAIT_SECONDS": "1",
        "FAIRPOST_SHUTDOWN_GRACE": "2",
        "FAIRPOST_SENDER__MAX_JITTER_SECONDS": "0",
        "FAIRPOST_UNSUBSCRIBE__KEYS": '["' + "k" * 40 + '"]',
        "FAIRPOST_UNSUBSCRIBE__BASE_URL": "https://unsub.example.com",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["init-aws"]) == 0
    admin.config_resetstat()
    settings = load_settings()

    # What an application does: sends, a batch, a scheduled mail cancelled, reads.
    with MailClient(settings) as client:
        ids = [client.send("acme", **MAIL, idempotency_key=f"k{i}") for i in range(3)]
        ids += client.send_many("globex", [MAIL, MAIL])
        later = client.send("acme", **MAIL, send_at=datetime.now(UTC) + timedelta(hours=1))
        assert client.cancel(later)
        client.status(ids[0])
        client.suppressions().add("acme", "gone@example.org")
        client.suppressions().is_suppressed("acme", "gone@example.org")
        client.dead_letters().list()
        # Notification mail (its tenant's bulk lane) and an unsubscribe (issue #42).
        ids.append(client.send("acme", **MAIL, stream="notification", topic="digest"))
        assert client.unsubscribes().add("acme", "gone@example.org", "digest")
        client.unsubscribes().list("acme")
    with QuotaAdmin(settings) as admin_client:
        admin_client.pause("initech")
        admin_client.resume("initech")

    async def one_async() -> None:
        async with AsyncMailClient(settings) as aclient:
            ids.append(await aclient.send("acme", **MAIL))

    asyncio.run(one_async())

    # What the daemon does, sending them; what an operator runs beside it.
    with daemon_process(dict(os.environ), tmp_path, replica="acl"):
        ses_env.wait_for(len(ids), timeout=30)
        assert main(["stats", "--json"]) == 0
        assert main(["doctor", "--redis-only"]) in (0, 1)
    capsys.readouterr()

    # Read before the admin's own commands count (its INFO is one of fairpost's too).
    used = {name.removeprefix("cmdstat_") for name in admin.info("commandstats")}
    assert used - set(COMMANDS) - {"config|resetstat"} == set()
    assert {"evalsha", "lmpop", "xadd", "blpop", "info"} <= used
    errors = admin.info("errorstats")
    assert not any("NOPERM" in name for name in errors), errors
    assert admin.acl_log() == []


def test_the_operations_page_prints_the_template() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    assert acl_setuser() in page
