"""What each SES answer settles for its mail, and what a group's answers change.

Against fakes (tests/daemon/unit/fakes.py) for the job store and the quota
engine; SES's answers are given as values, as fairpost.mailer.daemon.ses
classifies them (the pipeline tests get them from the recording SES server).
"""

from __future__ import annotations

from typing import Any, cast

from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.answers import Answers
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.counting import Counting, Stamp
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.parking import Parking
from fairpost.mailer.daemon.settlement import HAND_BACK, Backoff, Delete
from tests.daemon.unit.fakes import FakeQuota, FakeStore, fake_context, mail

STAMP_MS = 7_000


def answers(**settings: Any) -> tuple[Answers, SenderContext, FakeStore, FakeQuota, Gate]:
    ctx, store, quota = fake_context(**settings)
    gate = Gate(cast(Any, quota), ctx.limits)
    endings = Endings(ctx)
    parking = Parking(ctx, gate, endings)
    return Answers(ctx, cast(Any, None), gate, endings, Counting(ctx), parking), ctx, store, quota, gate


async def test_a_sent_mail_is_deleted_and_keeps_its_units() -> None:
    obey, _, _, quota, _ = answers()
    sent = ses.SendResult(ses.Verdict.SENT, "x")
    settled = await obey.obey("acme", mail("acme", 0), Stamp(STAMP_MS, 0.0), sent)
    assert settled == Delete("sent")
    assert quota.refunds == []


async def test_a_refused_mail_ends_dead_and_its_units_go_back() -> None:
    obey, _, store, quota, _ = answers()
    msg = mail("acme", 0, recipients=3)
    result = ses.SendResult(ses.Verdict.PERMANENT, error="MessageRejected")
    assert await obey.obey("acme", msg, Stamp(STAMP_MS, 0.0), result) == Delete("dead")
    assert quota.refunds == [("acme", 3, STAMP_MS)]
    assert store.finished == {"j-0": str(JobState.DEAD)}


async def test_a_transient_failure_backs_off_doubling_then_ends_dead() -> None:
    obey, _, store, quota, _ = answers(sender={"max_attempts": 3, "backoff_base_seconds": 2.0})
    msg = mail("acme", 0)
    result = ses.SendResult(ses.Verdict.TRANSIENT, error="InternalFailure")
    waits = [await obey.obey("acme", msg, Stamp(STAMP_MS, 0.0), result) for _ in range(2)]
    assert waits == [Backoff(2.0, "ses_transient"), Backoff(4.0, "ses_transient")]
    assert await obey.obey("acme", msg, Stamp(STAMP_MS, 0.0), result) == Delete("dead")
    assert quota.refunds == []  # SES may have it: its units stay counted
    assert store.attempts == {"j-0": 3}


async def test_throttling_holds_the_whole_sender_and_the_mail_waits_as_long() -> None:
    obey, _, _, quota, gate = answers(sender={"max_jitter_seconds": 0})
    result = ses.SendResult(ses.Verdict.THROTTLED, error="Throttling")
    settled = await obey.obey("acme", mail("acme", 0), Stamp(STAMP_MS, 0.0), result)
    assert isinstance(settled, Backoff) and settled.seconds > 0
    assert gate.holding()
    assert quota.refunds == [("acme", 1, STAMP_MS)]  # refused: SES never took it


async def test_an_account_pause_waits_the_pause() -> None:
    obey, ctx, _, _, _ = answers()
    result = ses.SendResult(ses.Verdict.PAUSED, error="AccountSendingPausedException")
    settled = await obey.obey("acme", mail("acme", 0), Stamp(STAMP_MS, 0.0), result)
    assert settled == Backoff(ctx.settings.sender.pause_seconds, "ses_paused")


async def test_of_a_tenants_mails_its_ses_set_up_refused_one_waits_in_flight() -> None:
    obey, _, _, _, _ = answers()
    faulted = [mail("acme", n) for n in range(3)]
    refused = ses.SendResult(ses.Verdict.TENANT, error="denied", code="AccessDeniedException")
    for msg in faulted:
        msg.decide(Backoff(30.0, "ses_AccessDeniedException"))  # as obey said, each alone
    await obey.after_group("acme", [(m, refused, Stamp(STAMP_MS, 0.0)) for m in faulted], STAMP_MS)
    assert faulted[0].settlement == Backoff(30.0, "ses_AccessDeniedException")
    assert [m.settlement for m in faulted[1:]] == [HAND_BACK, HAND_BACK]
