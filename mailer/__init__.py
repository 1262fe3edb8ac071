"""fairpost's mail side: the SDK (:class:`MailClient`, :class:`AsyncMailClient`,
the admin classes, the outcome feed's events), the mail worker and the sender.

Only the SDK is imported here, so an application that enqueues mail needs
none of the daemon's dependencies.
"""

from fairpost.config.errors import ConfigError, FairpostError
from fairpost.dispatcher.errors import (
    EvictingRedis,
    NotReplayable,
    RedisNearlyFull,
    TooLateToCancel,
    UnknownJob,
)
from fairpost.mailer.errors import InvalidMail, RedisFailed
from fairpost.mailer.sdk.attachments import Attachment
from fairpost.mailer.sdk.client import AsyncMailClient, MailClient
from fairpost.mailer.sdk.dead import DeadLetters
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.sdk.outcomes.stream import AsyncEvent, Event
from fairpost.mailer.sdk.rollups import Deliverability
from fairpost.mailer.sdk.status import JobStatus
from fairpost.mailer.sdk.suppression import Suppressions
from fairpost.mailer.sdk.unsubscribes import Unsubscribes

__all__ = [
    "AsyncEvent",
    "AsyncMailClient",
    "Attachment",
    "ConfigError",
    "DeadLetters",
    "Deliverability",
    "Event",
    "EvictingRedis",
    "FairpostError",
    "InvalidMail",
    "JobStatus",
    "Mail",
    "MailClient",
    "NotReplayable",
    "RedisFailed",
    "RedisNearlyFull",
    "Suppressions",
    "TooLateToCancel",
    "UnknownJob",
    "Unsubscribes",
    "Webhooks",
]
