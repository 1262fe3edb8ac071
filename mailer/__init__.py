"""fairpost's mail side: the SDK (:class:`MailClient`, :class:`AsyncMailClient`),
the mail worker and the sender.

Only the SDK is imported here, so an application that enqueues mail needs
none of the daemon's dependencies.
"""

from config.errors import ConfigError, FairpostError
from dispatcher.errors import NotReplayable, TooLateToCancel, UnknownJob
from mailer.errors import InvalidMail, RedisFailed
from mailer.sdk.attachments import Attachment
from mailer.sdk.client import AsyncMailClient, MailClient
from mailer.sdk.dead import DeadLetters
from mailer.sdk.mail import Mail
from mailer.sdk.status import JobStatus
from mailer.sdk.suppression import Suppressions

__all__ = [
    "AsyncMailClient",
    "Attachment",
    "ConfigError",
    "DeadLetters",
    "FairpostError",
    "InvalidMail",
    "JobStatus",
    "Mail",
    "MailClient",
    "NotReplayable",
    "RedisFailed",
    "Suppressions",
    "TooLateToCancel",
    "UnknownJob",
]
