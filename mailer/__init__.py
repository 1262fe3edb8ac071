"""fairpost's mail side: the SDK (:class:`MailClient`, :class:`AsyncMailClient`),
the mail worker and the sender.

Only the SDK is imported here, so an application that enqueues mail needs
none of the daemon's dependencies.
"""

from config.errors import ConfigError, FairpostError
from dispatcher.errors import NotReplayable, TooLateToCancel, UnknownJob
from mailer.client import AsyncMailClient, MailClient
from mailer.dead import DeadLetters
from mailer.errors import InvalidMail
from mailer.mail import Mail
from mailer.mime import Attachment
from mailer.status import JobStatus

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
    "TooLateToCancel",
    "UnknownJob",
]
