"""How a received message ends a round: one settlement, like the dispatcher's outcomes.

The code that decides what becomes of a message (the group decision, the
answers, the endings) says it with one of these values; only
:class:`fairpost.mailer.daemon.inbox.Inbox` turns it into SQS calls. A round
is one look at the message: its receive, or a timed retry of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairpost.config.sections import SenderSettings


@dataclass(frozen=True)
class Delete:
    """Done with: sent, dead, suppressed, or finished already (``why`` says which)."""

    why: str


@dataclass(frozen=True)
class Park:
    """Waits ``seconds`` in SQS for its tenant (the quota, a pause, an SES hold that
    an operator or a change of limits may lift): remembered per tenant, so that
    :meth:`fairpost.mailer.daemon.inbox.Inbox.unpark` can bring it back at once."""

    seconds: float
    tenant: str
    reason: str


@dataclass(frozen=True)
class Backoff:
    """Waits ``seconds`` in SQS (a back-off, or another sender's send): nothing but
    time brings it back."""

    seconds: float
    why: str


@dataclass(frozen=True)
class HandBack:
    """Straight back to SQS (visibility 0): FIFO order keeps it behind its group's
    head, which waits in flight."""


@dataclass(frozen=True)
class TimedRetry:
    """This process asks for it again at ``at`` (monotonic): SQS counts visibility in
    whole seconds, too coarse for a wait of a moment. SQS keeps it hidden ``margin``
    seconds longer, so it comes back from there if this process dies meanwhile.
    ``tenant``: it waits for that tenant's quota, and an unpark brings it back too."""

    at: float
    margin: float
    tenant: str | None = None


@dataclass(frozen=True)
class Leave:
    """No SQS call: it comes back when its visibility ends (SES has or may have it
    unrecorded, or an outage was too long to ride out here)."""

    why: str


def attempt_backoff(attempts: int, settings: SenderSettings, why: str) -> Backoff:
    """A mail that failed ``attempts`` times waits twice as long as after the last."""
    seconds = min(settings.backoff_base_seconds * 2 ** (attempts - 1), settings.backoff_max_seconds)
    return Backoff(seconds, why)


Settlement = Delete | Park | Backoff | HandBack | TimedRetry | Leave

HAND_BACK = HandBack()
