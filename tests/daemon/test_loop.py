"""The one loop of the daemon's background tasks (fairpost.dispatcher.loop), with fake steps."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from redis.exceptions import OutOfMemoryError

from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.loop import forever
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.testing.wait import wait_for_async

LONG = 3600.0
"""A rest or a back-off no test waits out: only a stop or a wake ends it."""


class RecordingBackoff(OutageBackoff):
    """The real back-off, with what the loop asked of it."""

    def __init__(self, max_outage_seconds: float = 60.0, *, delay: float = 0.001) -> None:
        super().__init__(max_outage_seconds, first=delay, most=delay)
        self.calls: list[str] = []

    def succeeded(self) -> None:
        self.calls.append("succeeded")
        super().succeeded()

    def failed(self, exc: BaseException | None = None) -> float | None:
        self.calls.append("failed")
        return super().failed(exc)


class Errors:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Exception]] = []

    def __call__(self, task: str, exc: Exception) -> None:
        self.seen.append((task, exc))


async def test_an_exception_of_any_type_is_survived_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raised: list[Exception] = [ValueError("bad value"), KeyError("missing"), ZeroDivisionError("x / 0")]
    stop = asyncio.Event()
    errors = Errors()
    metrics = Metrics()
    went_on = asyncio.Event()

    async def step() -> None:
        if raised:
            raise raised.pop(0)
        went_on.set()
        stop.set()

    def on_error(task: str, exc: Exception) -> None:
        errors(task, exc)
        metrics.task_failed(task, exc)

    with caplog.at_level(logging.ERROR, logger="fairpost.tasks"):
        await asyncio.wait_for(
            forever("slots", step, stop, backoff=RecordingBackoff(), on_error=on_error), 30
        )

    assert went_on.is_set()
    assert [(task, type(exc)) for task, exc in errors.seen] == [
        ("slots", ValueError),
        ("slots", KeyError),
        ("slots", ZeroDivisionError),
    ]
    assert metrics.registry.get_sample_value("fairpost_task_errors_total", {"task": "slots"}) == 3
    failed = [r for r in caplog.records if "task slots step failed" in r.getMessage()]
    assert len(failed) == 3
    assert "ValueError: bad value" in failed[0].getMessage()
    assert failed[0].exc_info is not None  # the first failure in a row shows where it was
    assert failed[1].exc_info is None


async def test_a_failure_backs_off_before_the_next_step() -> None:
    stop = asyncio.Event()
    delay = 0.05
    backoff = RecordingBackoff(delay=delay)
    calls: list[float] = []

    async def step() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise OSError("connection refused")
        stop.set()

    await asyncio.wait_for(forever("heartbeat", step, stop, backoff=backoff), 30)

    assert backoff.calls == ["failed", "succeeded"]
    # The loop's timer may fire up to the clock's resolution early.
    assert calls[1] - calls[0] >= delay - 0.005


async def test_an_outage_longer_than_allowed_stops_the_task_loudly(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    errors = Errors()

    async def step() -> None:
        raise RuntimeError("redis is away")

    backoff = OutageBackoff(0.05, first=0.01, most=0.01)
    with (
        caplog.at_level(logging.CRITICAL, logger="fairpost.tasks"),
        pytest.raises(RuntimeError, match="away"),
    ):
        await asyncio.wait_for(forever("overrides", step, stop, backoff=backoff, on_error=errors), 30)

    assert len(errors.seen) >= 2  # it was ridden out for a while first
    assert not stop.is_set()
    stopping = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(stopping) == 1
    assert "task overrides failing for over 0.05s" in stopping[0].getMessage()


async def test_a_full_redis_is_ridden_out_past_the_outage_allowed_then_an_outage_is_timed_again() -> None:
    """An OOM refusal is no outage a restart mends: the daemon's sends free the room."""
    stop = asyncio.Event()
    errors = Errors()
    started = time.monotonic()

    async def step() -> None:
        if time.monotonic() - started < 0.3:  # six times the outage allowed
            raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        raise RuntimeError("redis is away")

    backoff = OutageBackoff(0.05, first=0.01, most=0.01)
    with pytest.raises(RuntimeError, match="away"):
        await asyncio.wait_for(forever("events", step, stop, backoff=backoff, on_error=errors), 30)
    full = [exc for _, exc in errors.seen if isinstance(exc, OutOfMemoryError)]
    away = [exc for _, exc in errors.seen if isinstance(exc, RuntimeError)]
    assert full and time.monotonic() - started >= 0.3
    assert len(away) >= 2  # the outage after it was ridden out for a while, as any


async def test_success_starts_the_back_off_over() -> None:
    stop = asyncio.Event()
    backoff = RecordingBackoff(0.05, delay=0.005)
    started = time.monotonic()
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        # Failing every other step for several times the outage allowed: each success
        # ends the outage, so the task never stops.
        if time.monotonic() - started > 0.25:
            stop.set()
        elif calls % 2:
            raise ConnectionError("blip")

    await asyncio.wait_for(forever("reconciler", step, stop, backoff=backoff), 30)

    assert stop.is_set()
    assert backoff.calls[:4] == ["failed", "succeeded", "failed", "succeeded"]


async def test_stop_ends_a_rest_promptly() -> None:
    stop = asyncio.Event()
    steps = 0

    async def step() -> float:
        nonlocal steps
        steps += 1
        return LONG

    task = asyncio.create_task(forever("ses-account", step, stop, backoff=RecordingBackoff()))
    await wait_for_async(lambda: steps == 1, within=10, what="the first step")
    stop.set()
    await asyncio.wait_for(task, 10)
    assert steps == 1


async def test_stop_ends_a_back_off_promptly() -> None:
    stop = asyncio.Event()
    backoff = RecordingBackoff(delay=LONG)

    async def step() -> None:
        raise TimeoutError("no answer")

    task = asyncio.create_task(forever("events", step, stop, backoff=backoff))
    await wait_for_async(lambda: backoff.calls == ["failed"], within=10, what="the first failure")
    stop.set()
    await asyncio.wait_for(task, 10)
    assert backoff.calls == ["failed"]


async def test_a_task_stopped_before_it_starts_runs_no_step() -> None:
    stop = asyncio.Event()
    stop.set()
    ran = False

    async def step() -> None:
        nonlocal ran
        ran = True

    await forever("dispatcher", step, stop, backoff=RecordingBackoff())
    assert not ran


async def test_a_wake_ends_the_rest() -> None:
    stop = asyncio.Event()
    wake = asyncio.Event()
    steps = 0

    async def step() -> float:
        nonlocal steps
        steps += 1
        wake.clear()
        if steps == 2:
            stop.set()
        return LONG

    task = asyncio.create_task(forever("ses-tenants", step, stop, backoff=RecordingBackoff(), wake=[wake]))
    await wait_for_async(lambda: steps == 1, within=10, what="the first step")
    wake.set()
    await asyncio.wait_for(task, 10)
    assert steps == 2


async def test_cancelling_the_task_is_no_failure_of_a_step() -> None:
    stop = asyncio.Event()
    errors = Errors()
    started = asyncio.Event()

    async def step() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(forever("webhooks", step, stop, backoff=RecordingBackoff(), on_error=errors))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert errors.seen == []


async def test_a_task_may_mask_what_its_failures_say(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    raised = [ValueError("no such recipient: ada@example.com")]

    async def step() -> None:
        if raised:
            raise raised.pop()
        stop.set()

    def masked(exc: Exception) -> str:
        return str(exc).replace("ada@example.com", "<address>")

    with caplog.at_level(logging.ERROR, logger="fairpost.tasks"):
        await asyncio.wait_for(
            forever("events", step, stop, backoff=RecordingBackoff(), described=masked), 30
        )

    [failed] = [r for r in caplog.records if "task events step failed" in r.getMessage()]
    assert "no such recipient: <address>" in failed.getMessage()
    assert "ada@" not in failed.getMessage()
    assert failed.exc_info is None  # a traceback would quote the text unmasked
