"""``fairpost webhook`` (add, list, remove, enable, disable, rotate-secret, attempts,
replay, each with --json) and the webhook lines of ``fairpost stats``, through the
real command line against a real redis-server, and the whole pipeline's mail
reaching a verifying receiver through the daemon's webhook tasks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.mailer.cli import main
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.conftest import delivering, hook_settings
from tests.outcomes.receiver import Answer, Receiver
from tests.outcomes.test_webhooks import write
from tests.support.pipeline import pipeline, quick_settings

KEYS = MailKeys()


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("FAIRPOST_WEBHOOK_ALLOW_PRIVATE", "true")

    def run(*argv: str, code: int = 0) -> Any:
        assert main(list(argv)) == code, capsys.readouterr().err
        out = capsys.readouterr().out
        return json.loads(out) if "--json" in argv else out

    return run


async def test_every_action_with_json(cli: Any, receiver: Receiver, aredis: redis.asyncio.Redis) -> None:
    made = cli(
        "webhook",
        "add",
        "acme",
        receiver.url("/cli"),
        "--event",
        "mail.sent",
        "--event",
        "mail.dead",
        "--json",
    )
    assert made["id"].startswith("ep_") and made["secret"].startswith("whsec_")
    [listed] = cli("webhook", "list", "--json")
    assert listed["id"] == made["id"] and listed["tenant"] == "acme" and listed["url"] == receiver.url("/cli")
    assert listed["enabled"] is True and listed["events"] == ["mail.sent", "mail.dead"]
    assert "secret" not in json.dumps(listed) and made["secret"] not in cli("webhook", "list")
    assert cli("webhook", "list", "--tenant", "globex", "--json") == []

    cli("webhook", "disable", made["id"], "--json")
    assert cli("webhook", "list", "--json")[0]["enabled"] is False
    cli("webhook", "enable", made["id"])
    rotated = cli("webhook", "rotate-secret", made["id"], "--json")
    assert rotated["id"] == made["id"] and rotated["secret"] != made["secret"]

    assert cli("webhook", "attempts", made["id"], "--json") == []
    replayed = cli("webhook", "replay", made["id"], "--since", "2020-01-01T00:00:00Z", "--json")
    assert replayed == {"id": made["id"], "since": "2020-01-01T00:00:00+00:00", "queued": 0}
    cli("webhook", "remove", made["id"], "--json")
    assert cli("webhook", "list", "--json") == []
    assert not await aredis.exists(KEYS.webhook_endpoint(made["id"]))


def test_bad_input_is_one_line_and_exit_1(cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook", "add", "acme", "ftp://x.example/y"]) == 1
    assert "url: must be https://" in capsys.readouterr().err
    assert main(["webhook", "enable", "ep_nope"]) == 1
    assert "no webhook endpoint 'ep_nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["webhook", "replay", "ep_x", "--since", "yesterday"])


def test_attempts_replay_and_stats_show_what_happened(cli: Any, redis_url: str, receiver: Receiver) -> None:
    # Blocking, as an operator's commands are; the daemon's tasks run in between.
    settings = hook_settings(redis_url, retry_schedule="50ms")
    made = cli("webhook", "add", "acme", receiver.url("/s"), "--json")
    receiver.secret("/s", made["secret"])
    receiver.plan("/s", Answer(500), Answer(500))

    async def deliver_until(count: int, write_first: bool) -> None:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            if write_first:
                await write(settings, client, "acme", "j1", feed.SENT)
            async with delivering(settings):
                await wait_for_async(
                    lambda: len(receiver.at("/s")) >= count, within=10, what=f"{count} attempts"
                )
        finally:
            await client.aclose()

    asyncio.run(deliver_until(2, write_first=True))
    attempts = cli("webhook", "attempts", made["id"], "--json")
    assert [a["result"] for a in attempts] == ["http_error", "http_error"]
    stats = cli("stats", "--json")
    assert stats["webhooks"]["acme"]["pending"] == 0 and stats["webhooks"]["acme"]["endpoints"] == 1
    # Given up after the schedule; replayed, it is delivered with its original id.
    replayed = cli("webhook", "replay", made["id"], "--since", "2020-01-01T00:00:00Z", "--json")
    assert replayed["queued"] == 1
    assert cli("stats", "--json")["webhooks"]["acme"]["pending"] == 1
    assert "acme: webhooks: 1 deliveries pending at 1 endpoints" in cli("stats")
    asyncio.run(deliver_until(3, write_first=False))
    assert receiver.at("/s")[-1].event is not None
    assert len({d.event_id for d in receiver.at("/s")}) == 1


async def test_the_pipelines_mail_reaches_the_tenants_receiver(
    redis_url: str, ses_env: SesServer, receiver: Receiver
) -> None:
    settings = quick_settings(redis_url, webhook={"allow_private": True, "retry_schedule": "50ms"})
    with Webhooks(settings) as hooks:
        made = hooks.add("acme", receiver.url("/app"))
    receiver.secret("/app", made.secret)
    async with pipeline(settings), delivering(settings), AsyncMailClient(settings) as client:
        ids = await client.send_many(
            "acme",
            [
                {"sender": "app@example.com", "to": [f"u{i}@example.org"], "subject": "s", "text": "t"}
                for i in range(5)
            ],
        )
        await wait_for_async(lambda: len(receiver.verified("/app")) >= 5, within=30, what="five mail.sent")
        statuses = {i: (await client.status(i)).ses_message_id for i in ids}
    got = {d.event["data"]["job_id"]: d.event for d in receiver.verified("/app") if d.event}
    assert set(got) == set(ids)
    for job_id, event in got.items():
        assert event["type"] == "mail.sent" and event["data"]["ses_message_id"] == statuses[job_id]
        assert event["data"]["tenant_id"] == "acme"
