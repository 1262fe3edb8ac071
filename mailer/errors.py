"""The mail side's errors, and the whole tree (config's and the dispatcher's
re-exported here, so ``fairpost.mailer.errors`` names every error fairpost raises)::

    FairpostError                 (fairpost.config.errors)
    ├── ConfigError               (fairpost.config.errors) the settings are invalid
    │   └── RedisAccessDenied     (fairpost.dispatcher.errors) Redis refused the credentials or a command
    ├── DispatchError             (fairpost.dispatcher.errors)
    │   ├── UnknownJob            no job has this id
    │   ├── TooLateToCancel       handed to SQS or finished already
    │   ├── NotReplayable         not a dead letter, or nothing left to send
    │   ├── NotReplicated         too few Redis replicas took a write in time (also a RedisError)
    │   ├── EvictingRedis         Redis's maxmemory-policy (allkeys-*) could evict queued mail
    │   ├── RedisNearlyFull       Redis is over the high-water mark: new mail refused (retriable)
    │   ├── NewerFormat           written by a newer fairpost: left for a newer reader
    │   ├── LayoutNotReadable     the Redis key layout is one this fairpost cannot read
    │   └── MigrationBusy         another fairpost migrate held its lock too long
    ├── InvalidInput              the caller's input breaks a rule (.field, .rule); nothing was written
    │   ├── InvalidMail           the SDK refused a mail
    │   ├── InvalidOverride       a live quota override is invalid
    │   ├── InvalidSuppression    a suppression-list or unsubscribe entry is invalid
    │   └── InvalidWebhook        a webhook endpoint is invalid (a URL, an event type)
    ├── InvalidToken              an unsubscribe token is malformed, forged or expired (.reason)
    ├── UnknownEndpoint           no webhook endpoint has this id
    ├── AddressNotPublic          a webhook endpoint's host resolves to a private address (also an OSError)
    ├── RedisFailed               Redis failed an SDK call (unreachable, too slow, out of memory)
    ├── PoisonMessage             an SQS body this fairpost cannot read (a dead letter)
    ├── SesAccountError           SES GetAccount gave no usable sending quota
    ├── SesTenantError            an SES tenant could not be read or provisioned
    ├── SesUnanswered             a pool's SES could not say whether a tenant's identities exist there
    ├── DemoError                 the demo could not run
    ├── ServiceError              a local service (redis-server, moto, LocalStack) did not start
    ├── RefusedRequest            the recording SES server refuses a malformed request, as SES would
    │   └── SqsError              the SQS server (fairpost.mailer.testing) refuses a request, as SQS would
    ├── ConfirmationStale         a console bulk action's confirmed count no longer matches its filter
    ├── SettledTwice              a message decided twice in one round: a defect (also an AssertionError)
    └── TimedOut                  a condition awaited did not hold in time (also an AssertionError)

An ``InvalidInput`` is the caller's to fix; the others are not.
Nothing here imports AWS or the daemon: the SDK raises these too.
"""

from __future__ import annotations

from fairpost.config.errors import ConfigError, FairpostError
from fairpost.dispatcher.errors import (
    DispatchError,
    EvictingRedis,
    LayoutNotReadable,
    MigrationBusy,
    NewerFormat,
    NotReplayable,
    NotReplicated,
    RedisAccessDenied,
    RedisNearlyFull,
    TooLateToCancel,
    UnknownJob,
)

__all__ = [
    "AddressNotPublic",
    "ConfigError",
    "ConfirmationStale",
    "DemoError",
    "DispatchError",
    "EvictingRedis",
    "FairpostError",
    "InvalidInput",
    "InvalidMail",
    "InvalidOverride",
    "InvalidSuppression",
    "InvalidToken",
    "InvalidWebhook",
    "LayoutNotReadable",
    "MigrationBusy",
    "NewerFormat",
    "NotReplayable",
    "NotReplicated",
    "PoisonMessage",
    "RedisAccessDenied",
    "RedisFailed",
    "RedisNearlyFull",
    "RefusedRequest",
    "ServiceError",
    "SesAccountError",
    "SesTenantError",
    "SesUnanswered",
    "SettledTwice",
    "SqsError",
    "TimedOut",
    "TooLateToCancel",
    "UnknownEndpoint",
    "UnknownJob",
]


class InvalidInput(FairpostError):
    """The input breaks a rule; nothing was written. ``field`` names where, ``rule`` what."""

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class InvalidMail(InvalidInput):
    """The mail breaks a rule; nothing was written."""


class RedisFailed(FairpostError):
    """Redis did not do what an SDK call needed: it is unreachable, too slow or out of memory.

    ``operation`` says which call (``enqueue``, ``status``, ``cancel``...);
    ``may_have_written`` whether Redis may have done the write all the same (an
    answer that never came): then retry an enqueue with the same idempotency key,
    which cannot duplicate the mail. The message names the Redis URL (password
    masked) and the timeout; the redis-py error is the ``__cause__``.
    """

    def __init__(self, operation: str, message: str, *, url: str, may_have_written: bool) -> None:
        self.operation = operation
        self.url = url
        self.may_have_written = may_have_written
        super().__init__(message)


class InvalidOverride(InvalidInput):
    """The override is invalid; nothing was written."""


class InvalidSuppression(InvalidInput):
    """The suppression-list entry is invalid; nothing was written."""


class InvalidToken(FairpostError):
    """An unsubscribe token that is not fairpost's, not whole, or expired. ``reason`` is
    ``malformed``, ``forged`` or ``expired``; nothing of what it names is said."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"unsubscribe token refused: {reason}")


class InvalidWebhook(InvalidInput):
    """The webhook endpoint is invalid (its URL, an event type); nothing was written."""


class UnknownEndpoint(FairpostError):
    """No webhook endpoint has this id."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        super().__init__(f"no webhook endpoint {endpoint!r}")


class AddressNotPublic(FairpostError, OSError):
    """A webhook endpoint's host resolves to an address that is not on the public
    internet, and FAIRPOST_WEBHOOK_ALLOW_PRIVATE is off: it is not called."""


class PoisonMessage(FairpostError):
    """An SQS body that is not a fairpost envelope this version can read."""


class SesAccountError(FairpostError):
    """SES GetAccount did not give the account's sending quota."""


class SesTenantError(FairpostError):
    """An SES tenant could not be read or provisioned (the SES error says why)."""


class SesUnanswered(FairpostError):
    """A pool's SES could not say whether a tenant's identities exist there (#43)."""


class DemoError(FairpostError):
    """The demo could not run."""


class ServiceError(FairpostError):
    """A local service (fairpost.mailer.testing) could not be started."""


class RefusedRequest(FairpostError):
    """A request the recording SES server (fairpost.mailer.testing) answers with SES's error."""

    def __init__(self, code: str, status: int, message: str) -> None:
        self.code = code
        self.status = status
        self.message = message
        super().__init__(f"{code} ({status}): {message}")


class SqsError(RefusedRequest):
    """A request the SQS server (fairpost.mailer.testing.sqs_server) answers with SQS's
    error: ``shape`` is its JSON ``__type``, ``code`` what botocore reports as ``Error.Code``
    (fairpost.mailer.testing.sqs_rules.Refuse builds them)."""

    def __init__(self, shape: str, code: str, message: str, status: int = 400) -> None:
        self.shape = shape
        super().__init__(code, status, message)


class ConfirmationStale(FairpostError):
    """The dead letters a console bulk action was confirmed for are no longer those its
    filter matches: the operator must look again."""

    def __init__(self, confirmed: int, now: int) -> None:
        self.confirmed = confirmed
        self.now = now
        super().__init__(f"{now} dead letters match now, not the {confirmed} confirmed: look again")


class SettledTwice(FairpostError, AssertionError):
    """A second decision for a received message within one round: a defect in the
    sender. Only a named override (``Received.overrule``, ``Received.reopen`` in
    fairpost.mailer.daemon.inbox) changes a decision."""


class TimedOut(FairpostError, AssertionError):
    """A condition did not hold before its deadline.

    An ``AssertionError`` too, so a test whose wait runs out fails as a test, not as an error.
    """
