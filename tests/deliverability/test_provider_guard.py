"""The reputation guard per mailbox provider, from outside: mail sent through the real
pipeline (SQS on moto, fairpost's SES emulator), SES bounces played onto the events
queue, and what follows read back as an operator and an application would (the job's
status, ``fairpost stats``, the outcome feed, what reached SES).

A tenant whose Gmail recipients bounce is held for Gmail alone: its Gmail mail
waits in Redis (never at the head of its FIFO group), its Outlook mail goes out."""

from __future__ import annotations

import asyncio
import json
from html import unescape
from typing import Any

import aiohttp
import pytest
import redis

from fairpost import AsyncMailClient
from fairpost.config import Settings
from fairpost.mailer.cli import main
from fairpost.mailer.daemon.provider_holds import FRESH_SECONDS, TAKEN_BACK_MIN_SECONDS
from fairpost.mailer.quota.provider_guard import held_providers
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.feed import HELD, from_entry
from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async as wait_for
from tests.console.conftest import TOKEN, serve
from tests.support.deliverability import EVENTS_QUEUE, FakeDns
from tests.support.pipeline import pipeline, quick_settings

KEYS = MailKeys()
BEARER = {"Authorization": f"Bearer {TOKEN}"}
GMAIL = ["ann@gmail.com", "bob@gmail.com", "cy@workspace.example", "dan@googlemail.com"]
OUTLOOK = ["dee@outlook.com", "eve@m365.example", "fay@hotmail.com", "gus@live.com"]


def mail_to(address: str) -> dict[str, Any]:
    return {"sender": "app@example.com", "to": [address], "subject": "hi", "text": "hello"}


def guarded(redis_url: str, **reputation: Any) -> Settings:
    # The tenant-wide guard counts over 1000 sends: one bounce of eight pauses nobody,
    # so what is held here is the per-provider guard's doing.
    return quick_settings(
        redis_url,
        events_queue_name=EVENTS_QUEUE,
        console={"token": TOKEN},
        reputation={
            "per_provider": True, "provider_min_sends": 4, "min_sends": 1000,
            "provider_recheck_seconds": 1, **reputation,
        },
    )  # fmt: skip


def held_at(client: redis.Redis, tenant: str = "acme") -> list[str]:
    return sorted(held_providers(client.hget(KEYS.provider_guard(), tenant)))


def sent_to(ses: SesServer) -> list[str]:
    return [m.recipients[0] for m in ses.sent]


def held_events(client: redis.Redis) -> list[dict[str, Any]]:
    entries: list[tuple[str, dict[str, str]]] = client.xrange(KEYS.outcomes())  # type: ignore[assignment]
    events = [from_entry(i, f) for i, f in entries]
    return [e.data for e in events if e is not None and e.type == HELD]


async def test_gmail_bounces_hold_the_tenants_gmail_mail_while_its_outlook_mail_goes_out(
    redis_url: str, ses_env: SesServer, events: EventSink, fake_dns: FakeDns,
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    settings = guarded(redis_url)
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    async with (
        pipeline(settings, reputation=True, mx_lookup=fake_dns),
        AsyncMailClient(settings) as client,
    ):
        for address in GMAIL + OUTLOOK:
            await client.send("acme", **mail_to(address))
        await wait_for(lambda: len(ses_env.sent) >= 8, within=20, what="every first mail at SES")
        by_address = {m.recipients[0]: m.message_id for m in ses_env.sent}
        # One Gmail bounce of four Gmail sends: 25 % at Gmail (1 of 8, 12.5 %, overall).
        ses_env.emit("Bounce", by_address["ann@gmail.com"])
        await wait_for(lambda: held_at(redis_client) == ["gmail"], within=20, what="acme held at gmail")
        await asyncio.sleep(FRESH_SECONDS)  # (a process reads the holds at most once a second)

        gmail_job = await client.send("acme", **mail_to("hal@gmail.com"))
        hosted_job = await client.send("acme", **mail_to("ida@workspace.example"))  # Gmail by its MX
        outlook_job = await client.send("acme", **mail_to("joe@outlook.com"))
        await wait_for(lambda: _state(client, outlook_job, "sent"), within=20, what="the Outlook mail out")
        for job in (gmail_job, hosted_job):
            status = await client.status(job)
            # Waiting in Redis, with its own reason, for the guard's recheck.
            assert status.state == "scheduled" and status.waiting_for == "provider_paused:gmail", status
        assert not {"hal@gmail.com", "ida@workspace.example"} & set(sent_to(ses_env))

        # The console's and the operator's view, and the application's.
        assert await asyncio.to_thread(main, ["stats", "--json"]) == 0
        acme = json.loads(capsys.readouterr().out)["tenants"]["acme"]
        assert list(acme["provider_holds"]) == ["gmail"]
        assert acme["provider_holds"]["gmail"]["reason"].startswith("bounce rate 25.00% at gmail")
        assert await asyncio.to_thread(main, ["stats"]) == 0
        assert "acme: mail to gmail held by the reputation guard at" in capsys.readouterr().out
        async with serve(settings) as base, aiohttp.ClientSession(headers=BEARER) as http:
            async with http.get(base + "/") as response:
                assert "held at gmail by the reputation guard" in unescape(await response.text())
            async with http.get(base + "/tenants/acme") as response:
                page = unescape(await response.text())
                assert "its mail to gmail held by the reputation guard: bounce rate 25.00%" in page
        held = held_events(redis_client)
        assert sorted(e["job_id"] for e in held) == sorted([gmail_job, hosted_job])
        assert {e["reason"] for e in held} == {"provider_paused:gmail"}

        # An operator's resume lifts it; the held mail goes out at its next look.
        assert main(["tenant", "resume", "acme"]) == 0
        assert capsys.readouterr().out.strip() == "tenant acme: resumed"
        assert held_at(redis_client) == []
        await wait_for(
            lambda: {"hal@gmail.com", "ida@workspace.example"} <= set(sent_to(ses_env)),
            within=20, what="the Gmail mail sent once resumed",
        )  # fmt: skip
        assert len(held_events(redis_client)) == 2  # one event a mail, not one a recheck
        # Judged afresh since the lift: the old bounce holds nobody again.
        assert held_at(redis_client) == []
    assert sorted(sent_to(ses_env)).count("hal@gmail.com") == 1


async def test_mail_in_sqs_when_the_hold_begins_is_taken_back_and_its_group_goes_on(
    redis_url: str, ses_env: SesServer, events: EventSink, fake_dns: FakeDns, redis_client: redis.Redis
) -> None:
    settings = guarded(redis_url)
    receiving, parked = asyncio.Event(), asyncio.Event()
    receiving.set()

    async def before_receive() -> None:
        if not receiving.is_set():
            parked.set()  # no receive in flight: the next waits here
            await receiving.wait()

    async with (
        pipeline(settings, reputation=True, mx_lookup=fake_dns, before_receive=before_receive),
        AsyncMailClient(settings) as client,
    ):
        for address in GMAIL + OUTLOOK:
            await client.send("acme", **mail_to(address))
        await wait_for(lambda: len(ses_env.sent) >= 8, within=20, what="every first mail at SES")
        by_address = {m.recipients[0]: m.message_id for m in ses_env.sent}

        # The sender stops receiving (its poll in flight lands first); the next mail,
        # Gmail first in the tenant's FIFO group, reaches SQS before the hold begins.
        receiving.clear()
        await asyncio.wait_for(parked.wait(), 20)
        gmail_job = await client.send("acme", **mail_to("hal@gmail.com"))
        outlook_job = await client.send("acme", **mail_to("joe@outlook.com"))
        await wait_for(
            lambda: _states(client, [gmail_job, outlook_job], "dispatched"), within=20, what="in SQS"
        )
        ses_env.emit("Bounce", by_address["ann@gmail.com"])
        await wait_for(lambda: held_at(redis_client) == ["gmail"], within=20, what="acme held at gmail")
        await asyncio.sleep(FRESH_SECONDS)  # (the sender reads the holds at most once a second)

        receiving.set()
        await wait_for(lambda: _state(client, outlook_job, "sent"), within=20, what="the Outlook mail out")
        status = await client.status(gmail_job)
        assert status.state == "scheduled" and status.waiting_for == "provider_paused:gmail"
        assert "hal@gmail.com" not in sent_to(ses_env)
        # Out of SQS and out of the dispatched index: nothing counts it in flight.
        assert redis_client.zscore(KEYS.dispatched(), gmail_job) is None
        assert redis_client.zscore(KEYS.inflight("acme"), gmail_job) is None
        # Its next hand-off is past SQS's deduplication window (it keeps its dedup id).
        due = redis_client.zscore(KEYS.scheduled(), gmail_job)
        assert due is not None and redis_client.hget(KEYS.job(gmail_job), "waiting_until_ms") == str(int(due))
        now_ms = int(redis_client.time()[0]) * 1000
        assert due - now_ms >= (TAKEN_BACK_MIN_SECONDS - 20) * 1000
        assert [e["job_id"] for e in held_events(redis_client)] == [gmail_job]


async def test_the_hold_lifts_by_itself_once_the_days_with_the_bounces_leave_the_window(
    redis_url: str, ses_env: SesServer, events: EventSink, fake_dns: FakeDns, redis_client: redis.Redis
) -> None:
    settings = guarded(redis_url)
    async with (
        pipeline(settings, reputation=True, mx_lookup=fake_dns),
        AsyncMailClient(settings) as client,
    ):
        for address in GMAIL + OUTLOOK:
            await client.send("acme", **mail_to(address))
        await wait_for(lambda: len(ses_env.sent) >= 8, within=20, what="every first mail at SES")
        by_address = {m.recipients[0]: m.message_id for m in ses_env.sent}
        ses_env.emit("Bounce", by_address["ann@gmail.com"])
        await wait_for(lambda: held_at(redis_client) == ["gmail"], within=20, what="acme held at gmail")
        # The days age out of the window (as two days passing would, their counts
        # then older than the window): the guard's recheck lifts the hold.
        for key in redis_client.scan_iter(KEYS.rollup_prefix("acme") + "*"):
            redis_client.delete(key)
        await wait_for(lambda: held_at(redis_client) == [], within=20, what="the hold lifted")


async def _state(client: AsyncMailClient, job_id: str, state: str) -> bool:
    return (await client.status(job_id)).state == state


async def _states(client: AsyncMailClient, job_ids: list[str], state: str) -> bool:
    return all([await _state(client, j, state) for j in job_ids])
