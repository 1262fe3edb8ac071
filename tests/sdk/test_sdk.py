"""The SDK against a real Redis: what a send writes, and every rule that stops one.

Each rejected mail must raise :class:`InvalidMail` naming the field, and
leave Redis exactly as empty as the flushed database it found.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import redis

from fairpost import AsyncMailClient, InvalidMail, JobStatus, Mail, MailClient, UnknownJob
from fairpost.config import ConfigError, load_settings
from tests.support import KEYS, entry_ids, stored_payload

TENANT = "acme"
GOOD: dict[str, Any] = {
    "sender": "Acme <no-reply@acme.example>",
    "to": ["ada@example.com"],
    "subject": "Welcome",
    "text": "Hello!",
}
BAD_ADDRESSES = [
    "no-at-sign",
    "a@",
    "a@b..c",
    "a b@example.com",
    "@example.com",
    "",
    "ada@localhost",
    # parseaddr would keep the first address and silently drop the other one.
    "a@example.com, b@example.com",
    "a@example.com; b@example.com",
    "a@example.org <b@example.com>",
    "Ada <ada@example.com> trailing",
]
CRLF_ADDRESSES = [
    "ada@example.com\r\nBcc: eve@example.com",
    "ada@example.com\n",
    "Ada\r <ada@example.com>",
]


def _alone(address: object) -> Any:
    return address


def _second(address: object) -> Any:
    return ["ok@example.com", address]


# field → (how to place one address there, the field name the error must carry)
ADDRESS_FIELDS: dict[str, tuple[Callable[[object], Any], str]] = {
    "sender": (_alone, "sender"),
    "to": (_second, "to[1]"),
    "cc": (_second, "cc[1]"),
    "bcc": (_second, "bcc[1]"),
    "reply_to": (_second, "reply_to[1]"),
}


def rejected(
    client: MailClient, redis_client: redis.Redis, tenant: str = TENANT, **changes: Any
) -> InvalidMail:
    """Send GOOD with ``changes``; it must fail and leave Redis empty."""
    with pytest.raises(InvalidMail) as info:
        client.send(tenant, **{**GOOD, **changes})
    assert redis_client.dbsize() == 0, "a rejected mail wrote to Redis"
    return info.value


def accepted(client: MailClient, redis_client: redis.Redis, tenant: str = TENANT, **changes: Any) -> str:
    job_id = client.send(tenant, **{**GOOD, **changes})
    assert redis_client.exists(KEYS.job(job_id)) == 1
    return job_id


def payload(redis_client: redis.Redis, job_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(stored_payload(redis_client, job_id) or "")
    return data


def field_of(redis_client: redis.Redis, job_id: str, name: str) -> str:
    value = redis_client.hget(KEYS.job(job_id), name)
    assert isinstance(value, str), f"job {job_id} has no {name}"
    return value


# -- a valid send ------------------------------------------------------------


def assert_enqueued(redis_client: redis.Redis, job_id: str, recipients: int) -> None:
    record = redis_client.hgetall(KEYS.job(job_id))
    assert record["state"] == "queued"
    assert record["tenant"] == TENANT
    assert record["kind"] == "mail"
    assert record["priority"] == "normal"
    assert record["recipients"] == str(recipients)
    assert record["attempts"] == "0"
    assert int(record["created_ms"]) > 0
    assert entry_ids(redis_client.lrange(KEYS.queue(TENANT, "normal"), 0, -1)) == [job_id]
    assert redis_client.lrange(KEYS.ring(), 0, -1) == [TENANT]
    assert redis_client.sismember(KEYS.tenants(), TENANT)


def assert_status(status: JobStatus, job_id: str, recipients: int) -> None:
    assert status.job_id == job_id
    assert status.tenant_id == TENANT
    assert status.state == "queued"
    assert status.priority == "normal"
    assert status.recipients == recipients
    assert status.attempts == 0
    assert status.created_at is not None
    assert status.sent_at is None and status.dead_reason is None


def test_send_writes_the_job_and_queues_it(client: MailClient, redis_client: redis.Redis) -> None:
    assert redis_client.dbsize() == 0
    job_id = client.send(
        TENANT,
        sender="Acme <no-reply@acme.example>",
        to=["ada@example.com", "Bob <bob@example.com>"],
        cc="carol@example.com",
        bcc=["dan@example.com"],
        reply_to=["support@acme.example"],
        subject="Welcome",
        text="Hello!",
        html="<p>Hello!</p>",
        headers={"X-Campaign": "spring"},
    )
    assert isinstance(job_id, str) and job_id
    assert_enqueued(redis_client, job_id, recipients=4)
    mail = payload(redis_client, job_id)
    assert mail == {
        "from": "Acme <no-reply@acme.example>",
        "to": ["ada@example.com", "Bob <bob@example.com>"],
        "cc": ["carol@example.com"],
        "bcc": ["dan@example.com"],
        "reply_to": ["support@acme.example"],
        "subject": "Welcome",
        "text": "Hello!",
        "html": "<p>Hello!</p>",
        "headers": {"X-Campaign": "spring"},
    }
    assert_status(client.status(job_id), job_id, recipients=4)


def test_each_send_gets_its_own_id(client: MailClient, redis_client: redis.Redis) -> None:
    first = client.send(TENANT, **GOOD)
    second = client.send(TENANT, **GOOD)
    assert first != second
    assert entry_ids(redis_client.lrange(KEYS.queue(TENANT, "normal"), 0, -1)) == [first, second]
    assert redis_client.lrange(KEYS.ring(), 0, -1) == [TENANT]


@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_priority_picks_the_queue(client: MailClient, redis_client: redis.Redis, priority: str) -> None:
    job_id = client.send(TENANT, priority=priority, **GOOD)
    assert entry_ids(redis_client.lrange(KEYS.queue(TENANT, priority), 0, -1)) == [job_id]
    assert client.status(job_id).priority == priority


def test_from_env_reads_the_environment(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    with MailClient.from_env() as client:
        job_id = client.send(TENANT, **GOOD)
    assert redis_client.hget(KEYS.job(job_id), "state") == "queued"


def test_from_env_rejects_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", "http://localhost")
    with pytest.raises(ConfigError) as info:
        MailClient.from_env()
    assert [name for name, _ in info.value.problems] == ["FAIRPOST_REDIS_URL"]


def test_status_of_unknown_job(client: MailClient) -> None:
    with pytest.raises(UnknownJob) as info:
        client.status("0" * 32)
    assert info.value.job_id == "0" * 32


async def test_async_client_sends_and_reports(aclient: AsyncMailClient, redis_client: redis.Redis) -> None:
    job_id = await aclient.send(
        TENANT,
        sender="no-reply@acme.example",
        to=["ada@example.com"],
        cc=["b@example.com"],
        subject="Hi",
        text="Hello!",
    )
    assert_enqueued(redis_client, job_id, recipients=2)
    assert_status(await aclient.status(job_id), job_id, recipients=2)
    with pytest.raises(UnknownJob):
        await aclient.status("f" * 32)


async def test_async_client_rejects_and_writes_nothing(
    aclient: AsyncMailClient, redis_client: redis.Redis
) -> None:
    with pytest.raises(InvalidMail) as info:
        await aclient.send(TENANT, **{**GOOD, "to": ["ok@example.com", "a@b..c"]})
    assert info.value.field == "to[1]"
    with pytest.raises(InvalidMail) as info:
        await aclient.send_many(TENANT, [Mail(**GOOD), {**GOOD, "subject": ""}])
    assert info.value.field == "mails[1].subject"
    assert redis_client.dbsize() == 0


async def test_async_send_many_in_order(aclient: AsyncMailClient, redis_client: redis.Redis) -> None:
    ids = await aclient.send_many(TENANT, [GOOD] * 20, priority="low")
    assert entry_ids(redis_client.lrange(KEYS.queue(TENANT, "low"), 0, -1)) == ids
    assert len(set(ids)) == 20


# -- addresses ---------------------------------------------------------------


@pytest.mark.parametrize("field", list(ADDRESS_FIELDS))
@pytest.mark.parametrize("bad", BAD_ADDRESSES)
def test_invalid_address_is_rejected(
    client: MailClient, redis_client: redis.Redis, field: str, bad: str
) -> None:
    place, expected = ADDRESS_FIELDS[field]
    error = rejected(client, redis_client, **{field: place(bad)})
    assert error.field == expected
    assert "valid e-mail address" in error.rule
    assert str(error).startswith(expected + ": ")


@pytest.mark.parametrize("field", list(ADDRESS_FIELDS))
@pytest.mark.parametrize("bad", CRLF_ADDRESSES)
def test_cr_or_lf_in_address_is_rejected(
    client: MailClient, redis_client: redis.Redis, field: str, bad: str
) -> None:
    place, expected = ADDRESS_FIELDS[field]
    error = rejected(client, redis_client, **{field: place(bad)})
    assert error.field == expected
    assert "CR or LF" in error.rule


@pytest.mark.parametrize("field", list(ADDRESS_FIELDS))
def test_address_must_be_a_string(client: MailClient, redis_client: redis.Redis, field: str) -> None:
    place, expected = ADDRESS_FIELDS[field]
    error = rejected(client, redis_client, **{field: place(42)})
    assert error.field == expected


@pytest.mark.parametrize("field", list(ADDRESS_FIELDS))
def test_display_name_form_is_accepted(client: MailClient, redis_client: redis.Redis, field: str) -> None:
    place, _ = ADDRESS_FIELDS[field]
    job_id = accepted(client, redis_client, **{field: place("Ada <ada@example.com>")})
    mail = payload(redis_client, job_id)
    if field == "sender":
        assert mail["from"] == "Ada <ada@example.com>"
    else:
        assert mail[field] == ["ok@example.com", "Ada <ada@example.com>"]


def test_address_may_be_a_single_string(client: MailClient, redis_client: redis.Redis) -> None:
    job_id = accepted(client, redis_client, to="ada@example.com")
    assert payload(redis_client, job_id)["to"] == ["ada@example.com"]
    assert redis_client.hget(KEYS.job(job_id), "recipients") == "1"


def test_quoted_display_name_with_a_comma_is_one_address(
    client: MailClient, redis_client: redis.Redis
) -> None:
    job_id = accepted(client, redis_client, to=['"Lovelace, Ada" <ada@example.com>'])
    assert payload(redis_client, job_id)["to"] == ['"Lovelace, Ada" <ada@example.com>']
    assert redis_client.hget(KEYS.job(job_id), "recipients") == "1"


# -- recipients --------------------------------------------------------------


def addresses(count: int, domain: str) -> list[str]:
    return [f"r{i}@{domain}" for i in range(count)]


@pytest.mark.parametrize(
    "changes",
    [{"to": []}, {"to": ()}, {"to": [], "cc": [], "bcc": [], "reply_to": ["ada@example.com"]}],
)
def test_no_recipient_is_rejected(
    client: MailClient, redis_client: redis.Redis, changes: dict[str, Any]
) -> None:
    error = rejected(client, redis_client, **changes)
    assert error.field == "to"
    assert "at least one recipient" in error.rule


def test_bcc_alone_is_enough(client: MailClient, redis_client: redis.Redis) -> None:
    job_id = accepted(client, redis_client, to=[], bcc=["ada@example.com"])
    assert redis_client.hget(KEYS.job(job_id), "recipients") == "1"


@pytest.mark.parametrize(("to", "cc", "bcc"), [(51, 0, 0), (17, 17, 17), (0, 50, 1), (1, 0, 50)])
def test_51_recipients_are_rejected(
    client: MailClient, redis_client: redis.Redis, to: int, cc: int, bcc: int
) -> None:
    error = rejected(
        client,
        redis_client,
        to=addresses(to, "to.example"),
        cc=addresses(cc, "cc.example"),
        bcc=addresses(bcc, "bcc.example"),
    )
    assert error.field == "to"
    assert "at most 50" in error.rule and "got 51" in error.rule


@pytest.mark.parametrize(("to", "cc", "bcc"), [(50, 0, 0), (17, 17, 16), (1, 0, 49)])
def test_50_recipients_are_accepted(
    client: MailClient, redis_client: redis.Redis, to: int, cc: int, bcc: int
) -> None:
    job_id = accepted(
        client,
        redis_client,
        to=addresses(to, "to.example"),
        cc=addresses(cc, "cc.example"),
        bcc=addresses(bcc, "bcc.example"),
        reply_to=addresses(5, "reply.example"),  # not recipients
    )
    assert redis_client.hget(KEYS.job(job_id), "recipients") == "50"


# -- subject and body --------------------------------------------------------


@pytest.mark.parametrize("subject", ["Hi\rthere", "Hi\nthere", "Hi\r\nBcc: eve@example.com", "\n"])
def test_cr_or_lf_in_subject_is_rejected(client: MailClient, redis_client: redis.Redis, subject: str) -> None:
    error = rejected(client, redis_client, subject=subject)
    assert error.field == "subject"
    assert "CR or LF" in error.rule


@pytest.mark.parametrize("subject", ["", "   "])  # a tab is a control character: test_headers.py
def test_empty_subject_is_rejected(client: MailClient, redis_client: redis.Redis, subject: str) -> None:
    error = rejected(client, redis_client, subject=subject)
    assert error.field == "subject"
    assert "empty" in error.rule


def test_subject_longer_than_a_header_line_is_rejected(client: MailClient, redis_client: redis.Redis) -> None:
    error = rejected(client, redis_client, subject="s" * 999)
    assert error.field == "subject"
    accepted(client, redis_client, subject="s" * 998)


def test_subject_must_be_a_string(client: MailClient, redis_client: redis.Redis) -> None:
    assert rejected(client, redis_client, subject=None).field == "subject"


@pytest.mark.parametrize(("text", "html"), [(None, None), ("", None), (None, ""), ("", "")])
def test_no_body_is_rejected(client: MailClient, redis_client: redis.Redis, text: Any, html: Any) -> None:
    error = rejected(client, redis_client, text=text, html=html)
    assert error.field == "text"
    assert "text and html" in error.rule


@pytest.mark.parametrize(("text", "html"), [("plain", None), (None, "<p>rich</p>"), ("plain", "<p>rich</p>")])
def test_either_body_is_enough(client: MailClient, redis_client: redis.Redis, text: Any, html: Any) -> None:
    job_id = accepted(client, redis_client, text=text, html=html)
    mail = payload(redis_client, job_id)
    assert (mail["text"], mail["html"]) == (text, html)


@pytest.mark.parametrize("field", ["text", "html"])
def test_body_must_be_a_string(client: MailClient, redis_client: redis.Redis, field: str) -> None:
    changes: dict[str, Any] = {field: b"bytes"}
    assert rejected(client, redis_client, **changes).field == field


# -- tenant ids --------------------------------------------------------------


@pytest.mark.parametrize(
    "tenant",
    [
        "",
        "a" * 65,
        "a/b",
        "a b",
        "a:b",
        "a{b",
        "a}b",
        "tenänt",
        "\uff54\uff45\uff4e\uff41\uff4e\uff54",
        "acme\n",
        "\u0663",
    ],
)
def test_bad_tenant_id_is_rejected(client: MailClient, redis_client: redis.Redis, tenant: str) -> None:
    error = rejected(client, redis_client, tenant=tenant)
    assert error.field == "tenant_id"
    assert "1 to 64 characters" in error.rule


def test_tenant_id_must_be_a_string(client: MailClient, redis_client: redis.Redis) -> None:
    with pytest.raises(InvalidMail) as info:
        client.send(42, **GOOD)  # type: ignore[arg-type]
    assert info.value.field == "tenant_id"
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize("tenant", ["A" * 64, "aZ09._-" * 9 + "x", "a", "Acme.Corp_2-eu"])
def test_good_tenant_id_is_accepted(client: MailClient, redis_client: redis.Redis, tenant: str) -> None:
    job_id = client.send(tenant, **GOOD)
    assert entry_ids(redis_client.lrange(KEYS.queue(tenant, "normal"), 0, -1)) == [job_id]
    assert redis_client.hget(KEYS.job(job_id), "tenant") == tenant
    assert client.status(job_id).tenant_id == tenant


# -- headers -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["X:A", "X A", "X-A:", " X-A", "", "X-Ä", "X\tA", "X\r\nA"])
def test_bad_header_name_is_rejected(client: MailClient, redis_client: redis.Redis, name: str) -> None:
    error = rejected(client, redis_client, headers={"X-Ok": "1", name: "v"})
    assert error.field == f"headers[{name!r}]"
    assert "header name" in error.rule


@pytest.mark.parametrize("value", ["a\r\nBcc: eve@example.com", "a\nb", "a\rb", "\n"])
def test_cr_or_lf_in_header_value_is_rejected(
    client: MailClient, redis_client: redis.Redis, value: str
) -> None:
    error = rejected(client, redis_client, headers={"X-A": value})
    assert error.field == "headers['X-A']"
    assert "CR or LF" in error.rule


def test_header_value_must_be_a_string(client: MailClient, redis_client: redis.Redis) -> None:
    assert rejected(client, redis_client, headers={"X-A": 1}).field == "headers['X-A']"


def test_headers_must_be_a_mapping(client: MailClient, redis_client: redis.Redis) -> None:
    assert rejected(client, redis_client, headers=[("X-A", "1")]).field == "headers"


def test_good_headers_are_kept(client: MailClient, redis_client: redis.Redis) -> None:
    headers = {"X-Campaign": "spring", "List-Unsubscribe": "<https://acme.example/u?t=1>"}
    job_id = accepted(client, redis_client, headers=headers)
    assert payload(redis_client, job_id)["headers"] == headers


# -- size and priority -------------------------------------------------------


@pytest.fixture
def small_client(redis_url: str) -> Iterator[MailClient]:
    with MailClient(load_settings(redis_url=redis_url, max_message_bytes=2048)) as mail_client:
        yield mail_client


@pytest.mark.parametrize(
    "changes",
    [
        {"text": "x" * 3000},
        {"html": "<p>" + "x" * 3000 + "</p>"},
        {"text": "x" * 1000, "html": "y" * 1100},
        {"text": "é" * 1100},  # 1,100 characters but 2,200 bytes: the cap counts bytes
        {"headers": {f"X-H{i}": "v" * 100 for i in range(20)}},
    ],
)
def test_mail_over_the_size_cap_is_rejected(
    small_client: MailClient, redis_client: redis.Redis, changes: dict[str, Any]
) -> None:
    error = rejected(small_client, redis_client, **changes)
    assert error.field == "size"
    assert "2048" in error.rule and "FAIRPOST_MAX_MESSAGE_BYTES" in error.rule


def test_mail_under_the_size_cap_is_accepted(small_client: MailClient, redis_client: redis.Redis) -> None:
    job_id = accepted(small_client, redis_client, text="x" * 1500)
    stored = stored_payload(redis_client, job_id)
    assert isinstance(stored, str) and len(stored.encode()) <= 2048


@pytest.mark.parametrize("priority", ["urgent", "", "HIGH", "Normal"])
def test_bad_priority_is_rejected(client: MailClient, redis_client: redis.Redis, priority: str) -> None:
    error = rejected(client, redis_client, priority=priority)
    assert error.field == "priority"
    assert "high, normal, low" in error.rule


# -- send_many ---------------------------------------------------------------


def many(count: int) -> list[Mail | Mapping[str, object]]:
    """Alternately Mail objects and dicts of its fields."""
    mails: list[Mail | Mapping[str, object]] = []
    for i in range(count):
        fields = {**GOOD, "to": [f"r{i}@example.com"], "subject": f"Mail {i}"}
        mails.append(Mail(**fields) if i % 2 else fields)
    return mails


def test_send_many_enqueues_1000_in_order(client: MailClient, redis_client: redis.Redis) -> None:
    ids = client.send_many(TENANT, many(1000))
    assert len(ids) == 1000 and len(set(ids)) == 1000
    assert entry_ids(redis_client.lrange(KEYS.queue(TENANT, "normal"), 0, -1)) == ids
    assert redis_client.lrange(KEYS.ring(), 0, -1) == [TENANT]
    for i in (0, 1, 499, 999):
        assert payload(redis_client, ids[i])["subject"] == f"Mail {i}"
        assert redis_client.hget(KEYS.job(ids[i]), "state") == "queued"


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"to": ["nobody"]}, "mails[500].to[0]"),
        ({"cc": ["ok@example.com", "a@b..c"]}, "mails[500].cc[1]"),
        ({"subject": "a\nb"}, "mails[500].subject"),
        ({"text": None}, "mails[500].text"),
        ({"headers": {"X A": "1"}}, "mails[500].headers['X A']"),
        ({"bcc": addresses(50, "bcc.example")}, "mails[500].to"),
    ],
)
def test_send_many_with_one_bad_mail_writes_nothing(
    client: MailClient, redis_client: redis.Redis, bad: dict[str, Any], expected: str
) -> None:
    mails = many(1000)
    mails[500] = {**GOOD, **bad}
    with pytest.raises(InvalidMail) as info:
        client.send_many(TENANT, mails)
    assert info.value.field.startswith("mails[500].")
    assert info.value.field == expected
    assert redis_client.dbsize() == 0


def test_send_many_rejects_what_is_not_a_mail(client: MailClient, redis_client: redis.Redis) -> None:
    mails = many(3)
    mails[1] = {**GOOD, "bogus": 1}
    with pytest.raises(InvalidMail) as info:
        client.send_many(TENANT, mails)
    assert info.value.field == "mails[1]"
    with pytest.raises(InvalidMail) as info:
        client.send_many(TENANT, [*many(2), "not a mail"])  # type: ignore[list-item]
    assert info.value.field == "mails[2]"
    assert redis_client.dbsize() == 0


def test_send_many_checks_tenant_and_priority(client: MailClient, redis_client: redis.Redis) -> None:
    with pytest.raises(InvalidMail) as info:
        client.send_many("a b", many(3))
    assert info.value.field == "tenant_id"
    with pytest.raises(InvalidMail) as info:
        client.send_many(TENANT, many(3), priority="asap")
    assert info.value.field == "priority"
    assert redis_client.dbsize() == 0


def test_send_many_of_nothing_writes_nothing(client: MailClient, redis_client: redis.Redis) -> None:
    assert client.send_many(TENANT, []) == []
    assert redis_client.dbsize() == 0
