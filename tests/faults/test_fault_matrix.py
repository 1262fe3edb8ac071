"""The fault matrix: a fault at every step of the pipeline, one step at a time.

A mail is sent through the real pipeline (dispatcher and sender in this event
loop; a real redis-server, moto's SQS, the recording SES) while every Redis
command, script, pipeline and AWS call is recorded (tests/faults/recorder.py).
Then, for each recorded step, the same mail is sent again with that one step
failing, once with the request lost and once with the answer lost, and the
promises are checked:

- the mail ends ``sent``, and SES got it exactly once;
- its message is gone from SQS (nothing stranded, nothing left to a
  visibility timeout it did not ask for);
- no background task died (the pipeline fails the test when one did).

The steps come from the recording, so a call site added later is covered
without editing this file. ``make test`` runs a sample (every step of a few
kinds, chosen the same way each run); ``make faults`` runs all of them
(FAIRPOST_FAULT_MATRIX=all).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from fairpost import MailClient
from fairpost.config import Settings
from fairpost.mailer.testing.services import MotoServer
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.daemon.test_sender import queue_is_empty
from tests.faults.recorder import MODES, Mode, Recorder, Step, recording
from tests.support.pipeline import pipeline, quick_settings

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FULL = os.environ.get("FAIRPOST_FAULT_MATRIX") == "all"
SAMPLE = 6
"""Steps per mode in the sample ``make test`` runs."""
RECOVERY_S = 90.0
"""A lost delete comes back after the visibility timeout (5 s here) and the
outage back-off is counted in seconds: far more than either needs."""


def settings_for(redis_url: str, run: int) -> Settings:
    # A prefix of its own for each run: nothing of an earlier run is seen.
    return quick_settings(
        redis_url,
        key_prefix=f"fault{run}",
        sender={
            "wait_seconds": 1,
            "receivers": 1,
            "backoff_base_seconds": 1,
            "pause_seconds": 1,
            "max_jitter_seconds": 0.2,
            "visibility_timeout": 5,
        },
    )


async def send_one(settings: Settings, ses: SesServer, recorder: Recorder, what: str) -> None:
    """One mail through the pipeline, the recorder armed from the enqueue on."""
    async with pipeline(settings) as run:
        # The SDK's blocking client is not recorded (only asyncio clients are):
        # its own retries are the SDK's business, and polling here must not
        # move the steps' numbering.
        with MailClient(settings) as client:
            job_id = client.send(
                "acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t"
            )
            recorder.armed = True

            async def settled() -> bool:
                return client.status(job_id).state == "sent" and queue_is_empty(run.queue_url)

            await wait_for_async(settled, within=RECOVERY_S, what=f"the mail sent and deleted ({what})")
            recorder.armed = False
            state = client.status(job_id).state
    sends = [mail for mail in ses.sent if mail.job_id == job_id]
    assert state == "sent", what
    assert len(sends) in allowed_sends(recorder), f"SES got the mail {len(sends)} times ({what})"


def allowed_sends(recorder: Recorder) -> set[int]:
    """How many times SES may get the mail: once, but for one step.

    SendEmail takes no idempotency token, so when its answer is lost nobody can
    know whether SES has the mail. fairpost sends it again rather than lose it
    (at least once, as SMTP does: docs/design.md, "Invariants, and the tests that hold them"); that
    one step may deliver twice, never more."""
    if recorder.mode == "lost-answer" and recorder.fired == Step("aws", "sesv2.SendEmail", 1):
        return {1, 2}
    return {1}


def sample(steps: list[Step], pick: Callable[[list[Step]], list[Step]]) -> list[Step]:
    return steps if FULL else pick(steps)


def spread(steps: list[Step]) -> list[Step]:
    """``SAMPLE`` steps spread over the recording, the same ones each run."""
    if len(steps) <= SAMPLE:
        return steps
    stride = len(steps) / SAMPLE
    return [steps[int(i * stride)] for i in range(SAMPLE)]


@pytest.mark.timeout(0 if FULL else 900)
@pytest.mark.parametrize("mode", MODES)
async def test_one_mail_survives_a_fault_at_any_step(
    mode: Mode, redis_url: str, ses_env: SesServer, moto_srv: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with recording(monkeypatch) as recorder:
        await send_one(settings_for(redis_url, 0), ses_env, recorder, "no fault")
        # Polls and heartbeats repeat; their later calls are the same step again.
        steps = sorted({step for step in recorder.steps if step.occurrence <= 2})
        assert any(step.name == "sesv2.SendEmail" for step in steps), steps
        failures = []
        chosen = sample(steps, spread)
        for run, step in enumerate(chosen, start=1):
            moto_srv.reset()
            ses_env.reset()
            recorder.reset(step, mode)
            try:
                await send_one(settings_for(redis_url, run), ses_env, recorder, f"{mode} at {step}")
            except Exception as error:
                failures.append(f"{step}: {type(error).__name__}: {error}")
            assert recorder.fired == step or recorder.fired is None
    print(f"fault matrix ({mode}): {len(chosen)} of {len(steps)} steps, {len(failures)} failed")
    assert failures == [], "\n".join(failures)
