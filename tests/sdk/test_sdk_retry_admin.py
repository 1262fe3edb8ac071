"""The admin clients ride out a Redis outage as the mail client does (FAIRPOST_REDIS_RETRY_SECONDS).

``Suppressions``, ``Webhooks``, ``DeadLetters``, ``QuotaAdmin`` and ``WarmupAdmin``
try a call again while Redis is away, backing off, and only then raise
``RedisFailed``: a read, and a write that leaves Redis as one run would, after
any outage; a write a second run would repeat (a new endpoint, another secret,
events queued again) only while no try may have reached Redis. Real
redis-servers: every connection cut by a loopback proxy (tests/support/redis_cutter.py),
the server stopped and started again, or (a network mock: a reply cannot be
lost on cue otherwise) one reply dropped after Redis ran its command.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis

from fairpost import RedisFailed, Suppressions
from fairpost.config import Settings, load_settings
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.warmup_admin import WarmupAdmin
from fairpost.mailer.sdk.dead import DeadLetters
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from tests.sdk.test_sdk_retries import KEYS, RIDES_OUT, LosesOneReply, retrying, settings_for, through_outage
from tests.support.redis_cutter import RedisCutter, redis_cutter
from tests.support.topologies import Node

CUT_SECONDS = 1.0
HOOK = "http://127.0.0.1:9/in"
HOOKS = {"allow_private": True}
"""Where the endpoints added here point: nothing is delivered in these tests."""

Call = Callable[[Any], object]
Check = Callable[[redis.Redis], bool]

CASES = [
    pytest.param(
        Suppressions,
        lambda c: c.add("acme", "ada@example.org"),
        lambda r: r.hexists(KEYS.suppressed("acme"), "ada@example.org"),
        id="suppression-add",
    ),
    pytest.param(Suppressions, lambda c: c.list("acme"), None, id="suppression-list"),
    pytest.param(
        QuotaAdmin, lambda c: c.pause("acme"), lambda r: r.sismember(KEYS.paused(), "acme"), id="quota-pause"
    ),
    pytest.param(
        WarmupAdmin,
        lambda c: c.set_plan("acme", "10/day from 0s | none from 2 days"),
        lambda r: r.hexists(KEYS.warmup(), "acme"),
        id="warmup-set",
    ),
    pytest.param(DeadLetters, lambda c: c.list(), None, id="dead-letters-list"),
    pytest.param(Webhooks, lambda c: c.list(), None, id="webhook-list"),
]


def through(cutter: RedisCutter) -> Settings:
    return load_settings(
        redis_url=cutter.url(), redis_connect_timeout=0.5, redis_retry_seconds=RIDES_OUT, webhook=HOOKS
    )


@pytest.mark.parametrize(("client_type", "call", "done"), CASES)
def test_an_admin_call_during_a_cut_returns_once_redis_answers(
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    client_type: type[Any],
    call: Call,
    done: Check | None,
) -> None:
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    with redis_cutter(redis_url) as cutter:
        settings = load_settings(
            redis_url=cutter.url(), redis_connect_timeout=0.5, redis_retry_seconds=RIDES_OUT
        )
        with client_type(settings) as client:
            cutter.cut(CUT_SECONDS)
            call(client)
    assert retrying(caplog), "the call never met the cut"
    if done is not None:
        with redis.Redis.from_url(redis_url) as r:
            assert done(r)


class LosesAnyReply(LosesOneReply):
    only = None


def test_a_write_a_repeat_would_duplicate_is_not_tried_again_once_it_may_have_reached_redis(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    # The answer of a command of the add is lost (the network mock of
    # test_sdk_retries): Redis may have the new endpoint, and adding it again
    # would make a second one.
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    LosesAnyReply.armed, LosesAnyReply.lost = False, 0
    pool = redis.ConnectionPool(port=node.port, connection_class=LosesAnyReply)
    settings = settings_for(node, redis_retry_seconds=RIDES_OUT, webhook=HOOKS)
    with redis.Redis(connection_pool=pool) as losing, Webhooks(settings, redis_client=losing) as hooks:
        hooks.list()
        LosesAnyReply.armed = True
        with pytest.raises(RedisFailed) as caught:
            hooks.add("acme", HOOK)
    assert LosesAnyReply.lost == 1, "the network mock did not drop the answer"
    assert caught.value.may_have_written
    assert not retrying(caplog)
    with node.client() as r:
        assert r.scard(KEYS.webhook_endpoints()) <= 1


def test_a_write_a_repeat_would_duplicate_is_tried_again_while_redis_refuses_connections(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    # Refused connections: no try reached Redis, so trying again duplicates nothing.
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    node.stop()
    with Webhooks(settings_for(node, redis_retry_seconds=RIDES_OUT, webhook=HOOKS)) as hooks:
        through_outage(lambda: hooks.add("acme", HOOK), caplog, node.start)
    with node.client() as r:
        assert r.scard(KEYS.webhook_endpoints()) == 1
