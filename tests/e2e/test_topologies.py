"""fairpost on the replicated Redis topologies production uses: a 6-node Redis Cluster
and a Sentinel group (tests/support/topologies.py), each test once per topology
(markers ``cluster`` and ``sentinel``).

The pipeline (SDK -> Redis -> dispatcher -> SQS on moto -> quota -> the recording
SES server), the dead-letter and cancel paths, the stats and every CLI command
that talks to Redis run on each, through the one client factory
(dispatcher/connect.py) the product uses.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.exceptions import RedisError

from fairpost import AsyncMailClient, MailClient, RedisFailed
from fairpost.config.limits import parse_limits
from fairpost.dispatcher.durable import NotReplicated, durability
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.cli import main
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.keys import MailKeys, mail_keys
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings


def mail(i: int, recipients: int = 1) -> Mail:
    return Mail(
        sender="app@example.com",
        to=[f"user{i}.{r}@example.org" for r in range(recipients)],
        subject=f"m{i}",
        text="hi",
    )


async def test_mail_flows_end_to_end(topology: dict[str, Any], ses_env: SesServer) -> None:
    ses = ses_env
    settings = quick_settings(tenant_limits="5/second", inflight_cap=10, **topology)
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        ids = await client.send_many("noisy", [mail(i) for i in range(12)])
        for tenant in ("a", "b", "c"):
            ids.append(await client.send(tenant, sender="app@example.com", to=["x@example.org"], subject="q"
                                         , text="q"))  # fmt: skip
        soon = datetime.now(UTC) + timedelta(seconds=1)
        ids.append(await client.send("a", sender="app@example.com", to=["s@example.org"], subject="s",
                                     text="s", send_at=soon))  # fmt: skip
        later = await client.send("a", sender="app@example.com", to=["c@example.org"], subject="c",
                                  text="c", send_at=datetime.now(UTC) + timedelta(hours=1))  # fmt: skip
        assert await client.cancel(later) == "scheduled"

        async def all_sent() -> bool:
            states = [(await client.status(i)).state for i in ids]
            return all(state == JobState.SENT for state in states)

        await wait_for_async(all_sent, within=30, what="every mail sent")
        stats = await collect_stats(run.store.redis, mail_keys(run.store.keys), settings)
        assert stats.to_json()["tenants"]["noisy"]["backlog"] == 0
    sent = [m.job_id or "" for m in ses.sent]
    assert sorted(sent) == sorted(ids), "every mail sent exactly once"
    assert ses.max_in_window_by(1.0, key=lambda m: m.tag("fairpost-tenant"))["noisy"] <= 5


def test_sync_sdk_dead_letters_and_idempotency(topology: dict[str, Any]) -> None:
    settings = quick_settings(**topology)
    with MailClient(settings) as client:
        first = client.send("acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t",
                            idempotency_key="order-1")  # fmt: skip
        again = client.send("acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t",
                            idempotency_key="order-1")  # fmt: skip
        assert again == first
        assert client.cancel(first) == "queued"
        with client.dead_letters() as dead:
            assert [letter.job_id for letter in dead.list(tenant="acme")] == [first]
            dead.replay(first)
            assert client.status(first).state == "queued"


def test_cli_commands(topology: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for name, value in topology.items():
        monkeypatch.setenv("FAIRPOST_" + name.upper(), str(value).lower() if value is True else str(value))

    def cli(*argv: str) -> str:
        capsys.readouterr()
        assert main(list(argv)) == 0, capsys.readouterr()
        return capsys.readouterr().out

    job_id = cli("send", "--tenant", "acme", "--from", "app@example.com", "--to", "a@example.org",
                 "--subject", "s", "--text", "t").strip()  # fmt: skip
    assert json.loads(cli("status", job_id, "--json"))["state"] == "queued"
    assert json.loads(cli("stats", "--json"))["tenants"]["acme"]["backlog"] == 1
    cli("quota", "set", "acme", "3/second")
    assert "3/second" in cli("quota", "show", "acme")
    cli("tenant", "pause", "acme")
    cli("tenant", "resume", "acme")
    cli("cancel", job_id)
    assert job_id in cli("dead", "list")
    assert "redis_cluster" in cli("check-config")
    assert os.environ["FAIRPOST_REDIS_URL"] == topology["redis_url"]


async def test_writes_the_product_relies_on_wait_for_the_replicas(topology: dict[str, Any]) -> None:
    """FAIRPOST_REDIS_MIN_REPLICAS=1: the enqueue returns once the replica has the job and a
    grant stands once the replica has it; asking for more replicas than there are fails
    the write as NotReplicated, which every caller treats as Redis being unavailable."""
    settings = quick_settings(redis_min_replicas=1, **topology)
    with MailClient(settings) as client:
        job_id = client.send("acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t")
        assert client.status(job_id).state == "queued"
    async with AsyncMailClient(settings) as aclient:
        await aclient.send("acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t")
        quota = QuotaEngine(aclient._redis, MailKeys(settings.key_prefix), durability=durability(settings))
        grant = await quota.acquire("acme", [1], parse_limits("10/second"), parse_limits("5/second"))
        assert grant.granted == 1

    # Replicas that never confirm: the SDK tries again (as for a failover), then gives up.
    # Two seconds of retries: time for a second try however slow a busy machine makes the first.
    too_many = quick_settings(
        redis_min_replicas=2, redis_wait_seconds=0.2, redis_retry_seconds=2.0, **topology
    )
    with MailClient(too_many) as client, pytest.raises(RedisFailed) as info:
        client.send("acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t")
    assert info.value.may_have_written
    assert "tried" in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, NotReplicated) and isinstance(cause, RedisError)
    assert (cause.acked, cause.wanted) == (1, 2)
    async with AsyncMailClient(too_many) as aclient:
        with pytest.raises(RedisFailed):
            await aclient.send("acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t")
        quota = QuotaEngine(aclient._redis, MailKeys(settings.key_prefix), durability=durability(too_many))
        with pytest.raises(NotReplicated):
            await quota.acquire("acme", [1], parse_limits("10/second"), parse_limits("5/second"))
