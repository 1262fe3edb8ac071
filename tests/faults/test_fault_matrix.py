"""The fault matrix: a fault at every step of the pipeline, one step at a time.

Two scenarios go through the real pipeline (dispatcher and sender in this
event loop; a real redis-server, moto's SQS, the recording SES): one mail, and
a small batch of three tenants, one of them over its quota, while SES answers
slowly. Every Redis command, script, pipeline and AWS call is recorded
(tests/faults/recorder.py). Then, for each recorded step, the scenario runs
again with that one step failing, once with the request lost and once with the
answer lost, and the promises are checked:

- every mail ends ``sent``, and SES got it exactly once (but for a lost
  SendEmail answer: :func:`allowed_duplicates`);
- no tenant's window at SES went over its limit;
- every message is gone from SQS (nothing stranded, nothing left to a
  visibility timeout it did not ask for);
- no background task died (the pipeline fails the test when one did);
- the fault fired: a run that never reached its step proves nothing, so it fails
  too. Each run starts with Redis's script cache empty, as the recording did.

The steps come from the recording, so a call site added later is covered
without editing this file. ``make test`` runs a sample: a step of every kind
(an SES call, an SQS call, a Redis command, pipeline and script) in each mode of
the one mail, and every kind once in the batch, its kinds shared between the
two modes (each batch run takes seconds of throttling and slow answers);
``make faults`` runs all of them (FAIRPOST_FAULT_MATRIX=all). The recording
without a fault is made once per scenario: both modes fail steps of it.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import pytest
import redis

from fairpost import MailClient
from fairpost.config import Settings, parse_limits
from fairpost.mailer.testing.services import MotoServer
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.daemon.test_sender import queue_is_empty
from tests.faults.recorder import MODES, Mode, Recorder, Step, recording
from tests.support.pipeline import pipeline, quick_settings

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FULL = os.environ.get("FAIRPOST_FAULT_MATRIX") == "all"
KINDS = frozenset({"sesv2", "sqs", "redis command", "redis pipeline", "redis script"})
"""What sorts of call a step is (:func:`kind`): the sample fails one of each."""
RECOVERY_S = 90.0
"""A lost delete comes back after the visibility timeout (5 s here) and the
outage back-off is counted in seconds: far more than either needs."""


@dataclass(frozen=True)
class Scenario:
    """What is sent, under which limits, and how slow SES answers."""

    name: str
    mails: tuple[str, ...]
    """One tenant id per mail, in the order they are enqueued."""
    tenant_limits: dict[str, str] = field(default_factory=dict)
    ses_latency: float = 0.0
    kinds_shared: bool = False
    """In ``make test``'s sample, each kind in one mode only (the modes take turns),
    rather than in both."""

    def settings(self, redis_url: str, run: int) -> Settings:
        # A prefix of its own for each run: nothing of an earlier run is seen.
        return quick_settings(
            redis_url,
            key_prefix=f"fault{run}",
            tenants={tenant: {"limits": limits} for tenant, limits in self.tenant_limits.items()},
            sender={
                "wait_seconds": 1,
                "receivers": 1,
                "backoff_base_seconds": 1,
                "pause_seconds": 1,
                "max_jitter_seconds": 0.2,
                "visibility_timeout": 5,
            },
        )


ONE_MAIL = Scenario("one mail", ("acme",))
BATCH = Scenario(
    "a throttled tenant beside two others, SES slow",
    ("noisy",) * 4 + ("acme", "umbrella", "acme"),
    tenant_limits={"noisy": "2/second"},
    # Long enough that the sender keeps a call counted while it runs.
    ses_latency=1.5,
    # Each run takes seconds of throttling and slow answers: fewer in the sample.
    kinds_shared=True,
)


async def run_scenario(
    scenario: Scenario, settings: Settings, ses: SesServer, recorder: Recorder, what: str
) -> None:
    """The scenario's mails through the pipeline, the recorder armed from the enqueue on."""
    ses.latency = scenario.ses_latency
    # Each run starts with Redis's script cache empty, as the recording did: a step
    # that loads a script (the first call of each script) is a step of every run.
    with redis.Redis.from_url(settings.redis_url) as client:
        client.script_flush()
    async with pipeline(settings) as run:
        # The SDK's blocking client is not recorded (only asyncio clients are):
        # its own retries are the SDK's business, and polling here must not
        # move the steps' numbering.
        with MailClient(settings) as client:
            jobs = [
                client.send(tenant, sender="app@example.com", to=["a@example.org"], subject="s", text="t")
                for tenant in scenario.mails
            ]
            recorder.armed = True

            async def settled() -> bool:
                return all(client.status(j).state == "sent" for j in jobs) and queue_is_empty(run.queue_url)

            await wait_for_async(settled, within=RECOVERY_S, what=f"every mail sent and deleted ({what})")
            recorder.armed = False
    sends = Counter(mail.job_id for mail in ses.sent)
    twice = [job for job in jobs if sends[job] == 2]
    assert all(sends[job] in (1, 2) for job in jobs), f"SES got the mails {sends} times ({what})"
    assert len(twice) <= allowed_duplicates(recorder), f"SES got {len(twice)} mails twice ({what})"
    for tenant, limits in scenario.tenant_limits.items():
        (window,) = parse_limits(limits)
        highest = ses.max_in_window_by(window.seconds, key=lambda m: m.tag("fairpost-tenant"))
        assert highest.get(tenant, 0) <= window.limit, f"{tenant} over {limits}: {highest} ({what})"


def allowed_duplicates(recorder: Recorder) -> int:
    """How many mails SES may get twice: none, but at one step.

    SendEmail takes no idempotency token, so when its answer is lost nobody can
    know whether SES has the mail. fairpost sends it again rather than lose it
    (at least once, as SMTP does: docs/design.md, "Invariants, and the tests
    that hold them"): that one mail may be delivered twice, never more."""
    fired = recorder.fired
    return int(recorder.mode == "lost-answer" and fired is not None and fired.name == "sesv2.SendEmail")


def kind(step: Step) -> str:
    """The sort of call a step is: the AWS service called, or a Redis command, pipeline or script."""
    if step.system == "aws":
        return step.name.partition(".")[0]
    if step.name.startswith("script "):
        return "redis script"
    return "redis pipeline" if step.name.startswith("MULTI ") else "redis command"


def sample(steps: list[Step], scenario: Scenario, mode: Mode) -> list[Step]:
    """A step of every kind (of every other kind, taking turns, if the scenario
    shares its kinds between the modes), the same ones each run, each a call
    site's first call; all of them with ``make faults``. Within a kind, each mode
    takes a different step: one a third of the way along its steps, the other two
    thirds."""
    if FULL:
        return steps
    by_kind: dict[str, list[Step]] = {}
    # First calls only: a call site's second call, which the recording reached, may
    # not come in a run whose timing groups its work otherwise (a busy machine),
    # and an unreached step fails the run (make faults still fails every one).
    for step in steps:
        if step.occurrence == 1:
            by_kind.setdefault(kind(step), []).append(step)
    turn = MODES.index(mode)
    kinds = sorted(by_kind)
    if scenario.kinds_shared:
        kinds = kinds[turn :: len(MODES)]
    return [by_kind[k][(turn + 1) * len(by_kind[k]) // (len(MODES) + 1)] for k in kinds]


_RECORDED: dict[str, list[Step]] = {}
"""Each scenario's steps, recorded without a fault by the first of its tests to run."""


async def recorded_steps(
    scenario: Scenario, redis_url: str, ses: SesServer, recorder: Recorder
) -> list[Step]:
    """The scenario's steps, from its run without a fault: made once, for both modes."""
    if scenario.name not in _RECORDED:
        await run_scenario(scenario, scenario.settings(redis_url, 0), ses, recorder, "no fault")
        # Polls and heartbeats repeat; their later calls are the same step again.
        steps = sorted({step for step in recorder.steps if step.occurrence <= 2})
        assert any(step.name == "sesv2.SendEmail" for step in steps), steps
        assert {kind(step) for step in steps} >= KINDS, steps
        _RECORDED[scenario.name] = steps
    return _RECORDED[scenario.name]


@pytest.mark.timeout(0 if FULL else 900)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scenario", [ONE_MAIL, BATCH], ids=["one-mail", "batch"])
async def test_the_pipeline_survives_a_fault_at_any_step(
    scenario: Scenario,
    mode: Mode,
    redis_url: str,
    ses_env: SesServer,
    moto_srv: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with recording(monkeypatch) as recorder:
        steps = await recorded_steps(scenario, redis_url, ses_env, recorder)
        failures = []
        unfired = []
        chosen = sample(steps, scenario, mode)
        for run, step in enumerate(chosen, start=1):
            moto_srv.reset()
            ses_env.reset()
            recorder.reset(step, mode)
            settings = scenario.settings(redis_url, run)
            try:
                await run_scenario(scenario, settings, ses_env, recorder, f"{mode} at {step}")
            except Exception as error:
                failures.append(f"{step}: {type(error).__name__}: {error}")
            if recorder.fired is None:
                unfired.append(step)
            else:
                assert recorder.fired == step
    fired = len(chosen) - len(unfired)
    print(
        f"fault matrix ({scenario.name}, {mode}): a fault fired at {fired} of {len(chosen)} chosen steps "
        f"(of {len(steps)} recorded), {len(failures)} runs broke a promise; "
        f"never reached: {', '.join(map(str, unfired)) or 'none'}"
    )
    assert failures == [], "\n".join(failures)
    assert unfired == [], f"{len(unfired)} of {len(chosen)} faults never fired: {unfired}"
