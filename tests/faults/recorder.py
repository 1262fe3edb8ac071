"""Every call the pipeline makes to Redis, SQS and SES, recorded and, on request, failed.

A *step* is one call site's n-th call: ``("redis", "EVALSHA 3f2a…", 2)`` is the
second run of that script, ``("aws", "sqs.DeleteMessage", 1)`` the first delete.
Counting per name rather than overall keeps a step the same call from one run to
the next, though background loops (polls, heartbeats) interleave differently.

A fault fails one step in one of two ways, as a network does:

- ``lost-request``: the call never reaches the server (nothing happened there);
- ``lost-answer``: the server did the work and the reply never came back.

The wrappers patch the client classes, not one client, so every Redis client and
every aiobotocore client the daemon builds is covered, and a call site added later
shows up in the recording without this file changing. This is a stand-in for the
network only: the servers behind it are real.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, Literal

import aiobotocore.client
import pytest
import redis.asyncio.client
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from redis.exceptions import ConnectionError as RedisConnectionError

from fairpost.dispatcher.calls import RING_GOES_HERE

Mode = Literal["lost-request", "lost-answer"]
MODES: tuple[Mode, ...] = ("lost-request", "lost-answer")
SCRIPT_PACKAGES = ("fairpost.dispatcher", "fairpost.mailer.daemon", "fairpost.mailer.quota")


@dataclass(frozen=True, order=True)
class Step:
    system: str  # "redis" or "aws"
    name: str
    occurrence: int  # 1 for the first call of that name

    def __str__(self) -> str:
        return f"{self.system}:{self.name}#{self.occurrence}"


@dataclass
class Recorder:
    """Counts calls once armed; fails the one ``target`` step when given one."""

    armed: bool = False
    target: Step | None = None
    mode: Mode = "lost-request"
    steps: list[Step] = field(default_factory=list)
    fired: Step | None = None
    _seen: Counter[tuple[str, str]] = field(default_factory=Counter)
    scripts: dict[str, str] = field(default_factory=dict)
    """sha1 -> a readable name (the script's first comment line)."""

    def reset(self, target: Step, mode: Mode) -> None:
        """Ready for a run that fails ``target``; the script names are kept."""
        self.armed, self.target, self.mode, self.fired = False, target, mode, None
        self.steps.clear()
        self._seen.clear()

    def step(self, system: str, name: str) -> Step | None:
        if not self.armed:
            return None
        self._seen[system, name] += 1
        step = Step(system, name, self._seen[system, name])
        self.steps.append(step)
        return step

    def should_fail(self, step: Step | None) -> bool:
        if step is None or self.fired is not None or step != self.target:
            return False
        self.fired = step
        return True


def _script_sources() -> list[tuple[str, str]]:
    """(file name, how its text ends) of every Lua script the product ships,
    longest first so that a script is never named for a shorter one it happens
    to end with. A script with ring.lua put inside it (RING_GOES_HERE: claim.lua)
    is known by what follows that line."""
    found = [
        (entry.name, entry.read_text(encoding="utf-8").partition(RING_GOES_HERE)[::2])
        for package in SCRIPT_PACKAGES
        for entry in files(package).iterdir()
        if entry.name.endswith(".lua")
    ]
    ends = [(name, tail or head) for name, (head, tail) in found]
    return sorted(ends, key=lambda item: -len(item[1]))


def _redis_name(recorder: Recorder, args: tuple[Any, ...]) -> str:
    command = str(args[0]).upper()
    if command in {"EVALSHA", "EVAL", "EVALSHA_RO"} and len(args) > 1:
        sha = str(args[1]) if command != "EVAL" else hashlib.sha1(str(args[1]).encode()).hexdigest()
        return f"script {recorder.scripts.get(sha, sha[:10])}"
    return command


def _pipeline_name(stack: list[Any]) -> str:
    return "MULTI " + " ".join(sorted({str(args[0]).upper() for args, _ in stack}))


@contextmanager
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    recorder = Recorder()
    real_register = redis.asyncio.client.Redis.register_script
    # redis-py leaves execute_command unannotated.
    real_execute: Callable[..., Awaitable[Any]] = redis.asyncio.client.Redis.execute_command
    real_pipeline = redis.asyncio.client.Pipeline.execute
    real_call = aiobotocore.client.AioBaseClient._make_api_call

    sources = _script_sources()

    def register_script(client: Any, script: Any) -> Any:
        text = script.decode() if isinstance(script, bytes) else str(script)
        # ring.lua is prepended to the dispatcher's scripts: a script is the file its text ends with.
        name = next((n for n, s in sources if text.rstrip().endswith(s.rstrip())), "unknown")
        recorder.scripts[hashlib.sha1(text.encode()).hexdigest()] = name
        return real_register(client, script)

    async def execute_command(client: Any, *args: Any, **options: Any) -> Any:
        step = recorder.step("redis", _redis_name(recorder, args))
        if recorder.should_fail(step) and recorder.mode == "lost-request":
            raise RedisConnectionError(f"injected: {step} never reached Redis")
        result = await real_execute(client, *args, **options)
        if recorder.fired == step and step is not None and recorder.mode == "lost-answer":
            raise RedisConnectionError(f"injected: {step}'s reply was lost")
        return result

    async def pipeline_execute(pipe: Any, raise_on_error: bool = True) -> Any:
        step = recorder.step("redis", _pipeline_name(pipe.command_stack)) if pipe.command_stack else None
        if recorder.should_fail(step) and recorder.mode == "lost-request":
            await pipe.reset()
            raise RedisConnectionError(f"injected: {step} never reached Redis")
        result = await real_pipeline(pipe, raise_on_error)
        if recorder.fired == step and step is not None and recorder.mode == "lost-answer":
            raise RedisConnectionError(f"injected: {step}'s reply was lost")
        return result

    async def make_api_call(client: Any, operation: str, params: Any) -> Any:
        service = client.meta.service_model.service_name
        step = recorder.step("aws", f"{service}.{operation}")
        endpoint = client.meta.endpoint_url
        if recorder.should_fail(step) and recorder.mode == "lost-request":
            raise EndpointConnectionError(endpoint_url=endpoint)
        result = await real_call(client, operation, params)
        if recorder.fired == step and step is not None and recorder.mode == "lost-answer":
            raise ReadTimeoutError(endpoint_url=endpoint)
        return result

    monkeypatch.setattr(redis.asyncio.client.Redis, "register_script", register_script)
    monkeypatch.setattr(redis.asyncio.client.Redis, "execute_command", execute_command)
    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", pipeline_execute)
    monkeypatch.setattr(aiobotocore.client.AioBaseClient, "_make_api_call", make_api_call)
    yield recorder
