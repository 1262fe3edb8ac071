"""IAM authentication to ElastiCache and MemoryDB (fairpost.dispatcher.iam), on a local Redis.

SigV4 itself is not checked here: no local Redis verifies AWS's signature. The
token's shape is checked against botocore's signing with made-up credentials; for
the rest, the test stands in for AWS's token service: the minter gives the password
an ACL user has now, and the test rotates that password (as a token expires) and
cuts the user's connections (as the service does after 12 hours). What is tested is
fairpost's side: a token minted for every new connection, connections renewed when
old, and no mail lost across a rotation (#37).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis

from fairpost import AsyncMailClient, MailClient
from fairpost.config import ConfigError, Settings, load_settings
from fairpost.config.sections import RedisIamSettings
from fairpost.dispatcher import connect, iam
from fairpost.mailer.errors import RedisAccessDenied
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings
from tests.support.tls import TlsFiles, tls_cluster, tls_redis

MAIL: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}


class TokenService:
    """Stands in for AWS: the token the IAM user authenticates with now."""

    def __init__(self, admin: redis.Redis, user: str) -> None:
        self.admin = admin
        self.user = user
        self.generation = 0
        self.rotate(cut=False)

    @property
    def token(self) -> str:
        return f"token-{self.generation}"

    def mint(self) -> str:
        return self.token

    def rotate(self, *, cut: bool) -> None:
        """A new token; the old one no longer authenticates. ``cut``: the user's
        connections are closed too."""
        self.generation += 1
        self.admin.acl_setuser(
            self.user, enabled=True, reset_passwords=True, passwords=[f"+{self.token}"],
            keys=["*"], commands=["+@all"], channels=["*"],
        )  # fmt: skip
        if cut:
            self.admin.client_kill_filter(user=self.user)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[TlsFiles, int]]:
    with tls_redis() as server:
        yield server


@pytest.fixture
def tokens(tls_server: tuple[TlsFiles, int], monkeypatch: pytest.MonkeyPatch) -> Iterator[TokenService]:
    files, port = tls_server
    admin: redis.Redis = files.client(port)
    admin.flushall()
    service = TokenService(admin, "app-iam")

    def stand_in(settings: RedisIamSettings) -> iam.Mint:
        assert (settings.user, settings.cache_name) == ("app-iam", "my-cache")
        return service.mint

    # The one stand-in: the SigV4 signature, which only AWS can check.
    monkeypatch.setattr(iam, "sigv4_minter", stand_in)
    yield service
    admin.acl_deluser(service.user)
    admin.close()


def iam_settings(tls_server: tuple[TlsFiles, int], **overrides: Any) -> Settings:
    files, port = tls_server
    return quick_settings(
        f"rediss://127.0.0.1:{port}/0",
        redis_tls_ca_file=str(files.ca),
        redis_iam={"user": "app-iam", "cache_name": "my-cache", **overrides},
    )


async def test_mail_survives_a_token_rotation_that_cuts_every_connection(
    tls_server: tuple[TlsFiles, int], tokens: TokenService, ses_env: SesServer
) -> None:
    settings = iam_settings(tls_server)
    async with AsyncMailClient(settings) as client, pipeline(settings):
        ids = [await client.send("acme", **MAIL) for _ in range(5)]
        await asyncio.to_thread(ses_env.wait_for, 5, 30)
        tokens.rotate(cut=True)  # the old token is refused, its connections gone
        ids += [await client.send("acme", **MAIL) for _ in range(5)]
        with MailClient(settings) as sync_client:
            ids += sync_client.send_many("globex", [MAIL, MAIL])
        await asyncio.to_thread(ses_env.wait_for, len(ids), 30)

        async def recorded_sent() -> bool:
            # A mail reaches SES before its record says so: the sender records SES's answer.
            return all([(await client.status(job)).state == "sent" for job in ids])

        await wait_for_async(recorded_sent, within=30, what="every mail recorded sent")
    assert ses_env.sent_count == len(ids)  # none lost, none twice


def test_a_connection_older_than_its_age_reconnects_with_a_new_token(
    tls_server: tuple[TlsFiles, int], tokens: TokenService
) -> None:
    settings = iam_settings(tls_server, max_connection_age=0.3)
    client = connect.redis_client(settings)
    try:
        first = client.client_id()
        assert client.acl_whoami() == "app-iam"
        tokens.rotate(cut=False)  # the old connection lives on; a new one needs the new token
        assert client.client_id() == first  # young yet: the same connection
        deadline = time.monotonic() + 10
        while client.client_id() == first:  # renewed once 0.3 s old, between two commands
            assert time.monotonic() < deadline, "the connection was never renewed"
            time.sleep(0.05)
    finally:
        client.close()


def test_a_refused_token_is_a_configuration_error_naming_the_iam_setting(
    tls_server: tuple[TlsFiles, int], tokens: TokenService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(iam, "sigv4_minter", lambda _: lambda: "a-token-redis-never-saw")
    settings = iam_settings(tls_server)
    started = time.monotonic()
    with MailClient(settings) as client, pytest.raises(RedisAccessDenied) as caught:
        client.send("acme", **MAIL)
    assert time.monotonic() - started < 2
    assert caught.value.setting == "FAIRPOST_REDIS_IAM__USER"
    assert "IAM token of user app-iam" in str(caught.value)
    assert "a-token-redis-never-saw" not in str(caught.value)


async def test_async_connections_renew_themselves_too(
    tls_server: tuple[TlsFiles, int], tokens: TokenService
) -> None:
    settings = iam_settings(tls_server, max_connection_age=0.3)
    client = connect.async_redis_client(settings)
    try:
        first = await client.client_id()
        tokens.rotate(cut=False)
        deadline = time.monotonic() + 10
        while await client.client_id() == first:
            assert time.monotonic() < deadline, "the connection was never renewed"
            await asyncio.sleep(0.05)
        assert await client.acl_whoami() == "app-iam"
    finally:
        await client.aclose()


def test_a_cluster_over_tls_takes_the_token_and_renews_its_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with tls_cluster() as (files, ports):
        nodes = [files.client(port) for port in ports]
        services = [TokenService(node, "app-iam") for node in nodes]  # the user on every node
        monkeypatch.setattr(iam, "sigv4_minter", lambda _: services[0].mint)
        settings = load_settings(
            redis_url=f"rediss://127.0.0.1:{ports[0]}/0", redis_cluster=True, redis_tls_ca_file=files.ca,
            redis_iam={"user": "app-iam", "cache_name": "my-cache", "max_connection_age": 0.3},
        )  # fmt: skip
        with MailClient(settings) as client:
            job = client.send("acme", **MAIL)
            assert client.status(job).state == "queued"
        direct = connect.redis_client(settings)
        try:
            first = direct.client_id()
            for service in services:
                service.rotate(cut=False)
            deadline = time.monotonic() + 10
            while direct.client_id() == first:
                assert time.monotonic() < deadline, "the connection was never renewed"
                time.sleep(0.05)
            assert direct.acl_whoami() == "app-iam"
        finally:
            direct.close()
            for node in nodes:
                node.close()


def test_the_token_is_a_sigv4_presigned_connect_url(monkeypatch: pytest.MonkeyPatch) -> None:
    # botocore signs with made-up credentials: the shape is checked, not AWS's verdict.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings = RedisIamSettings(user="app-iam", cache_name="my-cache", region="eu-west-1")
    token = iam.sigv4_minter(settings)()
    assert token.startswith("my-cache/?") and "://" not in token
    query = parse_qs(urlsplit("https://" + token).query)
    assert query["Action"] == ["connect"] and query["User"] == ["app-iam"]
    assert query["X-Amz-Expires"] == ["900"]
    assert query["X-Amz-Credential"][0].endswith("/eu-west-1/elasticache/aws4_request")
    assert query["X-Amz-Signature"][0]
    assert "ResourceType" not in query
    serverless = RedisIamSettings(
        user="app-iam", cache_name="my-cache", region="eu-west-1", service="memorydb", serverless=True
    )
    query = parse_qs(urlsplit("https://" + iam.sigv4_minter(serverless)()).query)
    assert query["ResourceType"] == ["ServerlessCache"]
    assert query["X-Amz-Credential"][0].endswith("/memorydb/aws4_request")


def test_iam_settings_name_what_is_wrong() -> None:
    iam_part = {"user": "app-iam", "cache_name": "my-cache"}
    with pytest.raises(ConfigError) as plain:
        load_settings(redis_url="redis://cache:6379/0", redis_iam=iam_part)
    assert "FAIRPOST_REDIS_IAM__USER, FAIRPOST_REDIS_URL" in str(plain.value) and "rediss://" in str(
        plain.value
    )
    with pytest.raises(ConfigError) as password:
        load_settings(redis_url="rediss://u:p@cache:6379/0", redis_iam=iam_part)
    assert "no user or password in the URL" in str(password.value)


def test_an_application_without_iam_imports_no_botocore() -> None:
    code = (
        "import sys; from fairpost import MailClient; from fairpost.config import load_settings; "
        "MailClient(load_settings(redis_url='rediss://127.0.0.1:1/0')).close(); "
        "assert not [m for m in sys.modules if m.startswith('botocore')], 'botocore imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
