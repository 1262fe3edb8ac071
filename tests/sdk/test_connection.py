"""Every client fairpost hands out, blocking or asyncio, closes the Redis
connection it opened and leaves open one it was given (mailer/sdk/connection.py),
as the Redis server sees it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio

from fairpost import AsyncMailClient, DeadLetters, MailClient, UnknownJob
from fairpost.config import Settings
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.suppression import Suppressions
from fairpost.mailer.testing.wait import wait_for, wait_for_async

Client = MailClient | DeadLetters | QuotaAdmin | Suppressions


def use_mail_client(client: Client) -> None:
    assert isinstance(client, MailClient)
    with pytest.raises(UnknownJob):
        client.status("nope")


def use_dead_letters(client: Client) -> None:
    assert isinstance(client, DeadLetters)
    assert client.list() == []


def use_quota_admin(client: Client) -> None:
    assert isinstance(client, QuotaAdmin)
    assert client.paused() == []


def use_suppressions(client: Client) -> None:
    assert isinstance(client, Suppressions)
    assert client.list("acme") == []


BLOCKING: list[tuple[type[Client], Callable[[Client], None]]] = [
    (MailClient, use_mail_client),
    (DeadLetters, use_dead_letters),
    (QuotaAdmin, use_quota_admin),
    (Suppressions, use_suppressions),
]


@pytest.fixture
def observer(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.ping()
    yield client
    client.close()


def connections(observer: redis.Redis) -> int:
    """Clients connected to the server, the observer included."""
    return len(observer.client_list())


@pytest.mark.parametrize(("cls", "use"), BLOCKING, ids=[c.__name__ for c, _ in BLOCKING])
def test_a_blocking_client_closes_the_connection_it_opened(
    cls: type[Client], use: Callable[[Client], None], settings: Settings, observer: redis.Redis
) -> None:
    alone = connections(observer)
    with cls(settings) as client:
        use(client)
        assert connections(observer) == alone + 1
    wait_for(lambda: connections(observer) == alone, within=5, what="the connection to close")


@pytest.mark.parametrize(("cls", "use"), BLOCKING, ids=[c.__name__ for c, _ in BLOCKING])
def test_a_blocking_client_leaves_a_given_connection_open(
    cls: type[Client], use: Callable[[Client], None], settings: Settings, observer: redis.Redis
) -> None:
    given = redis.Redis.from_url(settings.redis_url)
    try:
        alone = connections(observer)
        with cls(settings, redis_client=given) as client:
            use(client)
        assert connections(observer) == alone + 1
    finally:
        given.close()


async def test_the_async_client_closes_its_own_connection_and_leaves_a_given_one(
    settings: Settings, observer: redis.Redis
) -> None:
    alone = connections(observer)
    async with AsyncMailClient(settings) as client:
        with pytest.raises(UnknownJob):
            await client.status("nope")
        assert connections(observer) == alone + 1
    await wait_for_async(lambda: connections(observer) == alone, within=5, what="the connection to close")

    given = redis.asyncio.Redis.from_url(settings.redis_url)
    try:
        async with AsyncMailClient(settings, redis_client=given) as client:
            with pytest.raises(UnknownJob):
                await client.status("nope")
        assert connections(observer) == alone + 1
    finally:
        await given.aclose()
