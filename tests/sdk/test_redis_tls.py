"""``rediss://`` with a CA file of its own (FAIRPOST_REDIS_TLS_CA_FILE), on one server and
on a Redis Cluster over TLS: the SDK, the daemon's pipeline and ``fairpost doctor`` (#37)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fairpost import AsyncMailClient, MailClient, RedisFailed
from fairpost.config import ConfigError, load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline, quick_settings
from tests.support.tls import TlsFiles, tls_cluster, tls_redis

MAIL: dict[str, Any] = {"sender": "app@example.com", "to": ["ada@example.org"], "subject": "s", "text": "t"}


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[TlsFiles, int]]:
    with tls_redis() as server:
        yield server


@pytest.fixture(scope="module")
def tls_cluster_srv() -> Iterator[tuple[TlsFiles, list[int]]]:
    with tls_cluster() as cluster:
        yield cluster


def test_the_sdk_speaks_tls_trusting_the_ca_file(tls_server: tuple[TlsFiles, int]) -> None:
    files, port = tls_server
    settings = load_settings(redis_url=f"rediss://127.0.0.1:{port}/0", redis_tls_ca_file=files.ca)
    with MailClient(settings) as client:
        job = client.send("acme", **MAIL)
        assert client.status(job).state == "queued"


def test_without_the_ca_file_the_certificate_is_refused(tls_server: tuple[TlsFiles, int]) -> None:
    _, port = tls_server
    settings = load_settings(redis_url=f"rediss://127.0.0.1:{port}/0", redis_retry_seconds=0)
    with MailClient(settings) as client, pytest.raises(RedisFailed) as caught:
        client.send("acme", **MAIL)
    assert "certificate verify failed" in str(caught.value)


def test_a_ca_file_needs_tls_and_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        load_settings(redis_url="rediss://127.0.0.1:6379/0", redis_tls_ca_file=tmp_path / "nope.pem")
    assert "FAIRPOST_REDIS_TLS_CA_FILE" in str(missing.value) and "is not a file" in str(missing.value)
    (tmp_path / "ca.pem").write_text("x")
    with pytest.raises(ConfigError) as plain:
        load_settings(redis_url="redis://127.0.0.1:6379/0", redis_tls_ca_file=tmp_path / "ca.pem")
    assert "FAIRPOST_REDIS_TLS_CA_FILE, FAIRPOST_REDIS_URL" in str(plain.value)


async def test_a_cluster_over_tls_carries_mail_from_the_sdk_to_ses(
    tls_cluster_srv: tuple[TlsFiles, list[int]], ses_env: SesServer
) -> None:
    files, ports = tls_cluster_srv
    settings = quick_settings(
        f"rediss://127.0.0.1:{ports[1]}/0", redis_cluster=True, redis_tls_ca_file=str(files.ca)
    )
    with MailClient(settings) as client:
        sync_ids = client.send_many("acme", [MAIL, MAIL])
    async with AsyncMailClient(settings) as aclient, pipeline(settings):
        ids = [*sync_ids, await aclient.send("globex", **MAIL)]
        await asyncio.to_thread(ses_env.wait_for, len(ids), 30)

        async def recorded_sent() -> bool:
            # A mail reaches SES before its record says so (the sender records SES's
            # answer; the dispatcher's hand-off record may come later still).
            return all([(await aclient.status(job)).state == "sent" for job in ids])

        await wait_for_async(recorded_sent, within=30, what="every mail recorded sent")


def test_doctor_checks_a_tls_server_and_a_tls_cluster(
    tls_server: tuple[TlsFiles, int],
    tls_cluster_srv: tuple[TlsFiles, list[int]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files, port = tls_server
    monkeypatch.setenv("FAIRPOST_REDIS_URL", f"rediss://127.0.0.1:{port}/0")
    monkeypatch.setenv("FAIRPOST_REDIS_TLS_CA_FILE", str(files.ca))
    main(["doctor", "--json", "--redis-only"])
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["connection"]["verdict"] == "pass" and "over TLS" in checks["connection"]["detail"]
    assert checks["acl"]["verdict"] == "pass"

    cluster_files, ports = tls_cluster_srv
    monkeypatch.setenv("FAIRPOST_REDIS_URL", f"rediss://127.0.0.1:{ports[0]}/0")
    monkeypatch.setenv("FAIRPOST_REDIS_TLS_CA_FILE", str(cluster_files.ca))
    monkeypatch.setenv("FAIRPOST_REDIS_CLUSTER", "true")
    main(["doctor", "--json", "--redis-only"])
    report = json.loads(capsys.readouterr().out)["checks"]
    topology = next(c for c in report if c["check"] == "topology")
    assert topology["verdict"] == "pass" and "a cluster" in topology["detail"]
    policies = [c for c in report if c["check"] == "policy"]
    assert len(policies) == len(ports)  # every master read, over TLS
    monkeypatch.setenv("FAIRPOST_REDIS_CLUSTER", "false")
    assert main(["doctor", "--json", "--redis-only"]) == 1
    report = json.loads(capsys.readouterr().out)["checks"]
    topology = next(c for c in report if c["check"] == "topology")
    assert topology["verdict"] == "fail" and "FAIRPOST_REDIS_CLUSTER" in topology["detail"]
