"""One loop for every background task: run a step, ride out what it raises, stop on ``stop``.

A background task is a *step* that :func:`forever` runs again and again. The step
returns how long to rest before the next one (``None``: go on at once, for a step
that did its own waiting, such as a long poll or a BLPOP); a rest ends early when
``stop`` or one of the task's ``wake`` events is set.

Whatever a step raises (a Redis or AWS error, or a defect) is logged with the
task's name, reported to ``on_error`` (the daemon counts it in
``fairpost_task_errors_total{task}``) and ridden out on the task's
:class:`~fairpost.dispatcher.backoff.OutageBackoff`; a step that succeeds starts
the back-off over. Failures in a row that last longer than the back-off's
``max_outage_seconds`` are not ridden out: the last one is raised, the task ends
and the daemon stops loudly, for its supervisor to restart it; a refused credential or
command (fairpost.dispatcher.access) is raised at once: no outage, the
configuration; a full Redis (an OOM refusal) is ridden out however long it lasts,
since the daemon's own sends free it. So whether a task
lives never depends on which exception it met. Cancellation is no failure of a
step: it ends the loop at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from fairpost.dispatcher.access import ACL_DOCS, refusal
from fairpost.dispatcher.backoff import OutageBackoff, wait_or_stop

log = logging.getLogger("fairpost.tasks")

Step = Callable[[], Awaitable[float | None]]
"""One turn of a task; returns the seconds to rest before the next (None: none)."""

OnError = Callable[[str, Exception], None]
"""Told of each failed step: the task's name and what the step raised."""

Describe = Callable[[Exception], str]
"""What a step raised, for a log line (a task whose errors may carry addresses masks them)."""

_MAX_DESCRIBED = 500


def describe(exc: Exception) -> str:
    """The exception's type and the start of its text."""
    return f"{type(exc).__name__}: {str(exc)[:_MAX_DESCRIBED]}"


async def forever(
    task: str,
    step: Step,
    stop: asyncio.Event,
    *,
    backoff: OutageBackoff,
    on_error: OnError | None = None,
    wake: Sequence[asyncio.Event] = (),
    described: Describe | None = None,
) -> None:
    """Run ``step`` until ``stop`` is set; raise once failures outlast the outage allowed.

    ``described``: how a failure is told in the log; without it, the type and text
    of the exception, with its traceback at the first failure in a row (a defect
    shows where it is). With it, no traceback: its text is the task's to mask."""
    failures = 0
    while not stop.is_set():
        try:
            rest = await step()
        except Exception as exc:
            failures += 1
            if on_error is not None:
                on_error(task, exc)
            code = refusal(exc)
            if code is not None:
                log.critical(
                    "task %s: Redis refused fairpost (%s: %s): check the user and password in "
                    "FAIRPOST_REDIS_URL and the user's ACL (%s); stopping",
                    task, code, (described or describe)(exc), ACL_DOCS,
                )  # fmt: skip
                raise
            delay = backoff.failed(exc)
            if delay is None:
                log.critical(
                    "task %s failing for over %gs (%d steps in a row, the last: %s): stopping",
                    task, backoff.max_outage_seconds, failures, (described or describe)(exc),
                )  # fmt: skip
                raise
            traceback = exc if failures == 1 and described is None else None
            log.error(
                "task %s step failed (%s); again in %.1fs",
                task, (described or describe)(exc), delay, exc_info=traceback,
            )  # fmt: skip
            await wait_or_stop(stop, delay)
            continue
        if failures:
            log.info("task %s going again after %d failed steps", task, failures)
            failures = 0
        backoff.succeeded()
        if rest is not None:
            await wait_or_stop(stop, rest, *wake)
