"""A mail that can never fit a budget window is refused by the SDK (issue 12, item 3).

Against the limits the SDK can see (the settings): a window of a minute or
longer is a budget, and a mail to more recipients than its limit is refused
with :class:`InvalidMail` naming the window; a shorter window is a rate, and
a bigger mail is accepted (it goes alone once that window is empty).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from fairpost import InvalidMail, MailClient
from fairpost.config import Settings, load_settings

MAIL: dict[str, Any] = {"sender": "no-reply@acme.example", "subject": "Hi", "text": "Hello"}


def _to(count: int) -> list[str]:
    return [f"user{i}@example.com" for i in range(count)]


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return load_settings(
        redis_url=redis_url,
        tenant_limits="5/second; 8/hour",
        global_limits="14/second; 30/minute",
        tenants={"big": {"limits": "5/second; 100/day"}},
    )


def test_a_mail_over_a_rate_limit_is_accepted(client: MailClient, redis_client: redis.Redis) -> None:
    job_id = client.send("acme", to=_to(7), **MAIL)  # 7 > 5/second: a rate, it goes alone
    assert job_id and redis_client.dbsize() > 0


def test_a_mail_over_a_tenant_budget_is_refused_naming_the_window(
    client: MailClient, redis_client: redis.Redis
) -> None:
    with pytest.raises(InvalidMail) as info:
        client.send("acme", to=_to(9), **MAIL)
    assert info.value.field == "to"
    assert "8/hour" in info.value.rule and "tenant" in info.value.rule
    assert redis_client.dbsize() == 0


def test_a_mail_over_a_global_budget_is_refused_naming_the_window(
    client: MailClient, redis_client: redis.Redis
) -> None:
    with pytest.raises(InvalidMail) as info:
        client.send_many("big", [{**MAIL, "to": _to(2)}, {**MAIL, "to": _to(31)}])
    assert info.value.field == "mails[1].to"
    assert "30/minute" in info.value.rule and "global" in info.value.rule
    assert redis_client.dbsize() == 0
