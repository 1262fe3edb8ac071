"""A pipeline of scripts known to be loaded skips redis-py's SCRIPT EXISTS, and a
server that lost them (SCRIPT FLUSH: a restart, a failover) is asked again."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from fairpost.mailer.daemon.loaded_scripts import LoadedScripts

SCRIPT = "return redis.call('INCR', KEYS[1])"


def script_questions(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))


async def run_once(aredis: redis.asyncio.Redis, loaded: LoadedScripts) -> list[object]:
    script = aredis.register_script(SCRIPT)
    async with aredis.pipeline(transaction=False) as pipe:
        await script(keys=["n"], args=[], client=pipe)
        pipe.get("n")
        return await loaded.execute(pipe, lambda p: p.execute())


async def test_only_the_first_pipeline_of_known_scripts_asks_whether_they_are_loaded(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    loaded = LoadedScripts()
    asked = script_questions(redis_client)
    assert await run_once(aredis, loaded) == [1, "1"]
    assert script_questions(redis_client) == asked + 1
    assert await run_once(aredis, loaded) == [2, "2"]
    assert await run_once(aredis, loaded) == [3, "3"]
    assert script_questions(redis_client) == asked + 1


async def test_a_server_that_lost_its_scripts_is_asked_again(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    loaded = LoadedScripts()
    await run_once(aredis, loaded)
    redis_client.script_flush()
    with pytest.raises(NoScriptError):
        await run_once(aredis, loaded)
    # The caller's retry: asked, loaded, run.
    asked = script_questions(redis_client)
    assert await run_once(aredis, loaded) == [2, "2"]
    assert script_questions(redis_client) == asked + 1
