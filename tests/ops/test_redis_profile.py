"""bench.redis_profile: a script's own commands are charged to the script, on a real Redis."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from bench.redis_profile import attribute, script_names
from fairpost.dispatcher.calls import script
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.sdk.unsubscribes import unsubscribe_source


@pytest.fixture
def logged(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """Every command logged while the test runs; the shared server's settings put back after."""
    before = redis_client.config_get("slowlog-log-slower-than")
    redis_client.slowlog_reset()
    redis_client.config_set("slowlog-log-slower-than", 0)
    try:
        yield redis_client
    finally:
        redis_client.config_set("slowlog-log-slower-than", str(before["slowlog-log-slower-than"]))
        redis_client.slowlog_reset()


def test_a_scripts_commands_are_charged_to_it_and_plain_commands_to_themselves(logged: redis.Redis) -> None:
    source = "redis.call('GET', KEYS[1]); redis.call('INCR', KEYS[1]); return redis.call('INCR', KEYS[1])"
    counter = logged.register_script(source)
    logged.script_load(source)
    logged.slowlog_reset()
    logged.set("profile:n", 1)
    counter(keys=["profile:n"])
    counter(keys=["profile:n"])
    logged.config_set("slowlog-log-slower-than", 10_000)
    entries: list[dict[str, Any]] = logged.slowlog_get(1000)
    usage = attribute(entries, {hashlib.sha1(source.encode()).hexdigest(): "counter.lua"})
    assert usage["counter.lua"].calls == 2
    assert dict(usage["counter.lua"].inner) == {"GET": 2, "INCR": 4}
    assert usage["SET"].calls == 1
    assert not usage["SET"].inner


def test_every_script_is_named_as_fairpost_loads_it(redis_client: redis.Redis) -> None:
    names = script_names()
    for name in ("claim", "finish", "handoff", "enqueue"):
        assert names[redis_client.register_script(script(name)).sha] == f"dispatcher/{name}.lua"
    send_claim = lua_source("fairpost.mailer.daemon", "send_claim")
    assert names[redis_client.register_script(send_claim).sha] == "mailer/daemon/send_claim.lua"
    assert {"mailer/quota/acquire.lua", "mailer/quota/peek.lua"} <= set(names.values())
    unsubscribe = redis_client.register_script(unsubscribe_source())
    assert names[unsubscribe.sha] == "mailer/sdk/unsubscribe.lua"
