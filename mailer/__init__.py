"""fairpost's mail side: the SDK (:class:`MailClient`, :class:`AsyncMailClient`),
the mail worker and the sender.

Only the SDK is imported here, so an application that enqueues mail needs
none of the daemon's dependencies.
"""

from config.errors import ConfigError, FairpostError
from dispatcher.errors import UnknownJob
from mailer.client import AsyncMailClient, MailClient
from mailer.errors import InvalidMail
from mailer.mail import Mail
from mailer.status import JobStatus

__all__ = [
    "AsyncMailClient",
    "ConfigError",
    "FairpostError",
    "InvalidMail",
    "JobStatus",
    "Mail",
    "MailClient",
    "UnknownJob",
]
