"""A recording, fault-injecting Amazon SES v2 server for tests and benchmarks.

moto's SES v2 has no ``GetAccount`` and never enforces a quota or answers an
error, so the sender's tests talk to this instead: a real HTTP server (standard
library only, one thread per connection) that speaks SES v2's REST-JSON wire
protocol well enough for botocore's ``sesv2`` client. Point a client at it with
``endpoint_url=ses.url`` or ``AWS_ENDPOINT_URL_SESV2=ses.url``.

It answers these operations (and SES v2 tenants and reputation entities, and
publishes SES events to SQS: :mod:`fairpost.mailer.testing.ses_tenancy`):

- ``SendEmail`` (``POST /v2/email/outbound-emails``): 200 ``{"MessageId": ...}``
  and a :class:`SentMail` recorded, or an error answer exactly as SES v2 sends
  one (status code, ``x-amzn-ErrorType`` header, ``{"message": ...}`` body),
  which botocore raises as ``ClientError`` with that ``Error.Code``.
- ``GetAccount`` (``GET /v2/email/account``): the account's ``SendQuota``, with
  ``SentLast24Hours`` counting the recipients recorded here.

Errors come from, in this order: queued faults (:meth:`SesServer.fail_next`),
rules (:meth:`SesServer.fail_when`), a paused account (:meth:`SesServer.pause`),
an unverified sender (``require_verified``), an unknown configuration set or
tenant (``configuration_sets`` / ``tenants``), a malformed request (no sender,
no recipients, an address without ``@domain``, more than 50 recipients), the
24-hour quota and the per-second rate (see ``enforce_rate``). Quotas count
recipients, as SES does.

Example::

    with SesServer(max_send_rate=10) as ses:
        client = boto3.client("sesv2", endpoint_url=ses.url, ...)
        ses.fail_next(2, Faults.TOO_MANY_REQUESTS)
        ...
        ses.wait_for(100, timeout=10)
        assert ses.max_in_window(1.0, key=lambda m: m.tenant_name) <= 2
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import json
import socket
import struct
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from email import policy
from email.parser import BytesHeaderParser
from email.utils import getaddresses, parseaddr
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from fairpost.mailer.errors import RefusedRequest
from fairpost.mailer.testing.services import free_port
from fairpost.mailer.testing.ses_tenancy import EventSink, TenantBook, ses_event, simulator_events

__all__ = [
    "JOB_ID_TAG",
    "MAX_RECIPIENTS",
    "FaultRule",
    "Faults",
    "Rejection",
    "SentMail",
    "SesError",
    "SesServer",
    "max_in_window",
    "max_in_window_by",
]

JOB_ID_TAG = "fairpost-job-id"
"""The ``EmailTags`` name under which fairpost passes a mail's job id."""

MAX_RECIPIENTS = 50
"""SES refuses a message with more recipients (To + Cc + Bcc) than this."""

SEND_EMAIL_PATH = "/v2/email/outbound-emails"
ACCOUNT_PATH = "/v2/email/account"
_ERROR_TYPE_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.aws.services.email/"
_DAY = 86_400.0


@dataclass(frozen=True)
class SesError:
    """One error answer: what a SendEmail call gets instead of a MessageId.

    ``action="answer"`` answers ``status`` with ``x-amzn-ErrorType: code`` and a
    ``{"message": ...}`` JSON body (``code=None``: an HTML body and no header, as
    from a load balancer, which botocore reports with ``Code == str(status)``).
    ``"close"`` closes the connection without answering and ``"reset"`` resets
    it (TCP RST); botocore raises ``ConnectionClosedError`` for both.
    ``delay`` seconds pass before the answer (or the drop), e.g. to trip the
    client's read timeout.
    """

    code: str | None
    status: int
    message: str = ""
    action: Literal["answer", "close", "reset"] = "answer"
    delay: float = 0.0

    def with_message(self, message: str) -> SesError:
        return dataclasses.replace(self, message=message)

    def delayed(self, seconds: float) -> SesError:
        return dataclasses.replace(self, delay=seconds)

    @property
    def is_network_error(self) -> bool:
        return self.action != "answer"


class Faults:
    """Every error class fairpost handles, as SES v2 answers it."""

    # Throttled: refund the quota, back off, retry.
    TOO_MANY_REQUESTS = SesError("TooManyRequestsException", 429, "Maximum sending rate exceeded.")
    LIMIT_EXCEEDED = SesError("LimitExceededException", 400, "Daily message quota exceeded.")
    # Account-wide stop: pause the sender, keep every job.
    SENDING_PAUSED = SesError("SendingPausedException", 400, "Sending is paused for this account.")
    ACCOUNT_SUSPENDED = SesError(
        "AccountSuspendedException", 400, "The account has been suspended and cannot send email."
    )
    # One tenant's own SES set-up: that tenant alone waits (mailer/daemon/ses.py).
    ACCESS_DENIED_IDENTITY = SesError(
        "AccessDeniedException",
        403,
        "User: arn:aws:iam::123456789012:user/fairpost is not authorized to perform: ses:SendEmail "
        "on resource: arn:aws:ses:us-east-1:123456789012:identity/bad.example",
    )
    ACCESS_DENIED_FROM_ADDRESS = SesError(
        "AccessDeniedException",
        403,
        "User: arn:aws:iam::123456789012:user/fairpost is not authorized to perform: ses:SendEmail "
        "with an explicit deny in an identity-based policy (condition ses:FromAddress)",
    )
    ACCESS_DENIED = SesError("AccessDeniedException", 403, "Access denied.")
    """No resource named: only GetAccount can tell the account's refusal from the tenant's."""
    IDENTITY_NOT_VERIFIED = SesError(
        "MessageRejected",
        400,
        "Email address is not verified. The following identities failed the check in region "
        "US-EAST-1: app@bad.example",
    )
    CONFIGURATION_SET_MISSING = SesError(
        "NotFoundException", 404, "Configuration set <bad-events> does not exist."
    )
    TENANT_SENDING_PAUSED = SesError("SendingPausedException", 400, "Sending is paused for this tenant.")
    # Permanent: dead letter with the reason.
    MESSAGE_REJECTED = SesError("MessageRejected", 400, "The message was rejected.")
    MAIL_FROM_DOMAIN_NOT_VERIFIED = SesError(
        "MailFromDomainNotVerifiedException", 400, "The MAIL FROM domain is not verified."
    )
    BAD_REQUEST = SesError("BadRequestException", 400, "Missing final '@domain'")
    NOT_FOUND = SesError("NotFoundException", 404, "The resource does not exist.")
    # Transient: retry with backoff, counted as attempts.
    INTERNAL_SERVICE_ERROR = SesError(
        "InternalServiceErrorException", 500, "An error occurred with the Amazon SES API v2."
    )
    INTERNAL_FAILURE = SesError(
        "InternalFailure", 500, "The request processing has failed because of an unknown error."
    )
    SERVICE_UNAVAILABLE = SesError(
        "ServiceUnavailable", 503, "The request has failed due to a temporary failure of the server."
    )
    PLAIN_500 = SesError(None, 500, "Internal Server Error")
    PLAIN_503 = SesError(None, 503, "Service Unavailable")
    DROP_CONNECTION = SesError(None, 0, action="close")
    RESET_CONNECTION = SesError(None, 0, action="reset")

    @classmethod
    def all(cls) -> tuple[SesError, ...]:
        return tuple(value for value in vars(cls).values() if isinstance(value, SesError))


@dataclass(frozen=True)
class SentMail:
    """One SendEmail request as parsed; recorded when SES accepted it.

    ``to``/``cc``/``bcc`` are the envelope recipients: ``Destination`` if given,
    else (raw content) the message's To/Cc/Bcc headers. ``subject`` is
    ``Simple.Subject.Data`` or the raw message's Subject header. ``monotonic``
    and ``wall_time`` are taken when the server decided (the order of ``sent``).
    """

    message_id: str = ""
    monotonic: float = 0.0
    wall_time: float = 0.0
    from_address: str | None = None
    to: tuple[str, ...] = ()
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    subject: str | None = None
    raw_size: int | None = None
    raw_data: bytes | None = field(default=None, repr=False)
    template_name: str | None = None
    tenant_name: str | None = None
    configuration_set_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    reply_to: tuple[str, ...] = ()
    user_agent: str = ""
    """The request's ``User-Agent`` header: which client sent it."""

    @property
    def recipients(self) -> tuple[str, ...]:
        return self.to + self.cc + self.bcc

    @property
    def recipient_count(self) -> int:
        return len(self.to) + len(self.cc) + len(self.bcc)

    @property
    def job_id(self) -> str | None:
        return self.tags.get(JOB_ID_TAG)

    def tag(self, name: str) -> str | None:
        return self.tags.get(name)


RejectReason = Literal["injected", "rule", "paused", "unverified", "not_found", "invalid", "daily", "rate"]


@dataclass(frozen=True)
class Rejection:
    """A SendEmail call that got an error (or a dropped connection) instead of a MessageId."""

    monotonic: float
    wall_time: float
    reason: RejectReason
    error: SesError
    mail: SentMail | None  # None when the request could not be parsed

    @property
    def code(self) -> str | None:
        return self.error.code


@dataclass
class _Rule:
    predicate: Callable[[SentMail], bool]
    error: SesError
    remaining: int | None


class FaultRule:
    """Handle returned by :meth:`SesServer.fail_when`; ``cancel()`` removes the rule."""

    def __init__(self, server: SesServer, rule: _Rule) -> None:
        self._server = server
        self._rule = rule

    def cancel(self) -> None:
        self._server._remove_rule(self._rule)

    @property
    def remaining(self) -> int | None:
        return self._rule.remaining


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    error_type: str | None = None
    action: Literal["answer", "close", "reset"] = "answer"
    delay: float = 0.0


def _refused(error: SesError) -> RefusedRequest:
    return RefusedRequest(error.code or str(error.status), error.status, error.message)


class SesServer:
    """An SES v2 endpoint on 127.0.0.1, recording every accepted SendEmail.

    Quotas are those ``GetAccount`` reports. ``enforce_rate`` /
    ``enforce_daily`` default to whether ``max_send_rate`` /
    ``max_24_hour_send`` were given: a quota you set is a quota SES enforces
    (``TooManyRequestsException`` over the rate in any sliding second,
    ``LimitExceededException`` over the 24-hour quota); pass ``False`` to only
    report it. ``sent_last_24_hours`` is a baseline added to the recipients
    recorded here (in GetAccount and the daily check). ``latency`` seconds are
    waited before every SendEmail answer; ``arrival_delay`` seconds before
    one SendEmail in ``arrival_delay_every`` counts as arrived (a slow network
    or a connection set-up retried: SES sees that mail so much later than the
    client sent it, and later than mails sent after it).
    """

    DEFAULT_MAX_SEND_RATE: ClassVar[float] = 14.0
    DEFAULT_MAX_24_HOUR_SEND: ClassVar[float] = 50_000.0

    def __init__(
        self,
        *,
        max_send_rate: float | None = None,
        max_24_hour_send: float | None = None,
        enforce_rate: bool | None = None,
        enforce_daily: bool | None = None,
        sent_last_24_hours: float = 0.0,
        require_verified: Iterable[str] | None = None,
        configuration_sets: Iterable[str] | None = None,
        tenants: Iterable[str] | None = None,
        production_access: bool = True,
        latency: float = 0.0,
        arrival_delay: float = 0.0,
        arrival_delay_every: int = 1,
        validate: bool = True,
    ) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._max_send_rate = self.DEFAULT_MAX_SEND_RATE if max_send_rate is None else float(max_send_rate)
        self._max_24_hour_send = (
            self.DEFAULT_MAX_24_HOUR_SEND if max_24_hour_send is None else float(max_24_hour_send)
        )
        self.enforce_rate = max_send_rate is not None if enforce_rate is None else enforce_rate
        self.enforce_daily = max_24_hour_send is not None if enforce_daily is None else enforce_daily
        self._baseline_24h = float(sent_last_24_hours)
        self._verified = None if require_verified is None else {i.lower() for i in require_verified}
        self._configuration_sets = None if configuration_sets is None else set(configuration_sets)
        self._strict_tenants = tenants is not None
        self.tenancy = TenantBook()
        """SES tenants and their reputation entities (CreateTenant, GetReputationEntity, ...)."""
        for name in tenants or ():
            self.tenancy.create(name)
        self.events: EventSink | None = None
        """Where SES events go (the mailbox simulator's, and :meth:`emit`'s); None: nowhere."""
        self.production_access = production_access
        self.latency = latency
        self.arrival_delay = arrival_delay
        self.arrival_delay_every = arrival_delay_every
        self._arrivals = 0
        self.validate = validate

        self._sent: list[SentMail] = []
        self._rejections: list[Rejection] = []
        self._requests = 0
        self._account_requests = 0
        self._errors: list[BaseException] = []
        self._queued: deque[SesError] = deque()
        self._rules: list[_Rule] = []
        self._paused: SesError | None = None
        self._second: deque[tuple[float, int]] = deque()
        self._second_sum = 0
        self._day: deque[tuple[float, int]] = deque()
        self._day_sum = 0

        self._stopping = threading.Event()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._conn_lock = threading.Lock()
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> SesServer:
        if self._httpd is not None:
            raise RuntimeError("SesServer already started")
        self._stopping.clear()
        last_error: OSError | None = None
        for _ in range(20):
            port = free_port()
            try:
                httpd = _HttpServer(("127.0.0.1", port), _Handler, self)
            except OSError as exc:  # the port was taken between free_port() and bind
                last_error = exc
                continue
            break
        else:
            raise RuntimeError(f"no free port for SesServer: {last_error}")
        self._httpd = httpd
        self._port = port
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"ses-server-{port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._conn_lock:
            connections = list(self._connections.items())
        for sock, _ in connections:
            with contextlib.suppress(OSError):  # already closed by its handler
                sock.shutdown(socket.SHUT_RDWR)
        for _, handler_thread in connections:
            handler_thread.join(timeout=5)
        httpd.server_close()
        thread.join(timeout=5)
        self._httpd = None
        self._thread = None
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> SesServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("SesServer is not running")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- configuration, live ---------------------------------------------------------------

    def set_quota(
        self,
        *,
        max_send_rate: float | None = None,
        max_24_hour_send: float | None = None,
        sent_last_24_hours: float | None = None,
    ) -> None:
        """Change the account's quotas (what GetAccount reports and, if enforced, what is enforced)."""
        with self._cond:
            if max_send_rate is not None:
                self._max_send_rate = float(max_send_rate)
            if max_24_hour_send is not None:
                self._max_24_hour_send = float(max_24_hour_send)
            if sent_last_24_hours is not None:
                self._baseline_24h = float(sent_last_24_hours)

    def verify(self, *identities: str) -> None:
        """Add verified identities (addresses or domains); starts requiring verification."""
        with self._cond:
            if self._verified is None:
                self._verified = set()
            self._verified.update(i.lower() for i in identities)

    def fail_next(self, n: int, error: SesError) -> None:
        """Answer the next ``n`` SendEmail calls (after any already queued) with ``error``."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self._cond:
            self._queued.extend([error] * n)

    def fail_when(
        self, predicate: Callable[[SentMail], bool], error: SesError, *, times: int | None = None
    ) -> FaultRule:
        """Answer ``error`` to every SendEmail whose parsed mail matches ``predicate``.

        The predicate gets the mail as it would be recorded (its ``message_id`` is
        not used if rejected). ``times`` limits how often the rule fires; rules
        are tried in the order they were added. Returns a handle to cancel it.
        """
        rule = _Rule(predicate, error, times)
        with self._cond:
            self._rules.append(rule)
        return FaultRule(self, rule)

    def _remove_rule(self, rule: _Rule) -> None:
        with self._cond:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear_faults(self) -> None:
        """Forget queued faults and rules, and resume."""
        with self._cond:
            self._queued.clear()
            self._rules.clear()
            self._paused = None

    def pause(self, error: SesError = Faults.SENDING_PAUSED) -> None:
        """Answer every SendEmail with ``error`` until :meth:`resume`; GetAccount says sending is off."""
        with self._cond:
            self._paused = error

    def resume(self) -> None:
        with self._cond:
            self._paused = None

    def reset(self) -> None:
        """Forget everything recorded and every fault; keep the configuration."""
        with self._cond:
            self._sent.clear()
            self._rejections.clear()
            self._errors.clear()
            self._requests = 0
            self._account_requests = 0
            self._second.clear()
            self._second_sum = 0
            self._day.clear()
            self._day_sum = 0
            self.clear_faults()
            self._cond.notify_all()

    # -- accessors -------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        with self._cond:
            return self._paused is not None

    @property
    def max_send_rate(self) -> float:
        with self._cond:
            return self._max_send_rate

    @property
    def max_24_hour_send(self) -> float:
        with self._cond:
            return self._max_24_hour_send

    @property
    def sent(self) -> list[SentMail]:
        with self._cond:
            return list(self._sent)

    @property
    def sent_count(self) -> int:
        with self._cond:
            return len(self._sent)

    @property
    def recipients_sent(self) -> int:
        with self._cond:
            return sum(m.recipient_count for m in self._sent)

    @property
    def requests(self) -> int:
        """SendEmail calls received, accepted or not."""
        with self._cond:
            return self._requests

    @property
    def account_requests(self) -> int:
        """GetAccount calls received."""
        with self._cond:
            return self._account_requests

    @property
    def rejections(self) -> list[Rejection]:
        with self._cond:
            return list(self._rejections)

    @property
    def rejected_count(self) -> int:
        with self._cond:
            return len(self._rejections)

    def sent_last_24_hours(self) -> float:
        """What GetAccount reports as ``SentLast24Hours`` now."""
        with self._cond:
            self._prune(time.monotonic())
            return self._baseline_24h + self._day_sum

    def wait_for(self, count: int, timeout: float = 10.0) -> list[SentMail]:
        """Wait until at least ``count`` mails are recorded; AssertionError after ``timeout`` s."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._sent) >= count, timeout):
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {count} sent mails: {len(self._sent)} sent, "
                    f"{len(self._rejections)} rejected, {self._requests} SendEmail requests"
                )
            return list(self._sent)

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` SendEmail calls were answered (accepted or rejected)."""
        self.wait_until(lambda s: len(s._sent) + len(s._rejections) >= count, timeout, f"{count} requests")

    def wait_until(self, predicate: Callable[[SesServer], bool], timeout: float, what: str = "") -> None:
        """Wait until ``predicate(self)`` holds, re-checked after every request."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what or predicate!r}: {len(self._sent)} sent, "
                    f"{len(self._rejections)} rejected, {self._requests} SendEmail requests"
                )

    def max_in_window(self, seconds: float, key: Callable[[SentMail], Hashable] | None = None) -> int:
        """Most recipients recorded in any window ``[t, t + seconds)``; see :func:`max_in_window`."""
        return max_in_window(self.sent, seconds, key)

    def max_in_window_by(self, seconds: float, key: Callable[[SentMail], Hashable]) -> dict[Hashable, int]:
        """Per key value, most recipients recorded in any window ``[t, t + seconds)``."""
        return max_in_window_by(self.sent, seconds, key)

    # -- request handling (handler threads) ------------------------------------------------

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised while handling requests (answered as 500 InternalFailure)."""
        with self._cond:
            return list(self._errors)

    def _record_error(self, exc: BaseException) -> None:
        with self._cond:
            self._errors.append(exc)
            self._cond.notify_all()

    def _track(self, sock: socket.socket) -> None:
        with self._conn_lock:
            self._connections[sock] = threading.current_thread()

    def _untrack(self, sock: socket.socket) -> None:
        with self._conn_lock:
            self._connections.pop(sock, None)

    def emit(
        self, event_type: str, message_id: str, recipients: Iterable[str] | None = None, **options: Any
    ) -> None:
        """Publish an SES event (``Bounce``, ``Complaint``, ``Delivery``, ``Reject``,
        ``DeliveryDelay``) for a recorded mail to :attr:`events`."""
        assert self.events is not None, "set SesServer.events to an EventSink first"
        mail = next(m for m in self.sent if m.message_id == message_id)
        listed = mail.recipients if recipients is None else tuple(recipients)
        self.events.emit(ses_event(event_type, mail, listed, **options))

    def _handle(self, method: str, path: str, body: bytes, user_agent: str = "") -> _Answer:
        if self.tenancy.handles(path):
            try:
                status, payload = self.tenancy.handle(method, path, body)
            except RefusedRequest as exc:
                return _error_answer(SesError(exc.code, exc.status, exc.message))
            except ValueError as exc:
                return _error_answer(SesError("SerializationException", 400, f"Malformed JSON: {exc}"))
            return _json_answer(status, payload)
        if path == SEND_EMAIL_PATH and method == "POST":
            return self._send_email(body, user_agent)
        if path == ACCOUNT_PATH and method == "GET":
            return self._get_account()
        if path in (SEND_EMAIL_PATH, ACCOUNT_PATH):
            return _error_answer(SesError("MethodNotAllowedException", 405, f"{method} not allowed"))
        return _error_answer(
            SesError("UnknownOperationException", 404, f"SesServer does not implement {method} {path}")
        )

    def _get_account(self) -> _Answer:
        with self._cond:
            self._account_requests += 1
            self._prune(time.monotonic())
            paused = self._paused
            payload = {
                "DedicatedIpAutoWarmupEnabled": False,
                "EnforcementStatus": (
                    "SHUTDOWN"
                    if paused is not None and paused.code == "AccountSuspendedException"
                    else "HEALTHY"
                ),
                "ProductionAccessEnabled": self.production_access,
                "SendQuota": {
                    "Max24HourSend": self._max_24_hour_send,
                    "MaxSendRate": self._max_send_rate,
                    "SentLast24Hours": self._baseline_24h + self._day_sum,
                },
                "SendingEnabled": paused is None,
                "SuppressionAttributes": {"SuppressedReasons": ["BOUNCE", "COMPLAINT"]},
            }
            self._cond.notify_all()
        return _json_answer(200, payload)

    def _send_email(self, body: bytes, user_agent: str = "") -> _Answer:
        if self.arrival_delay > 0:
            with self._cond:
                self._arrivals += 1
                delayed = self._arrivals % self.arrival_delay_every == 0
            if delayed:
                time.sleep(self.arrival_delay)  # this request's own handler thread
        try:
            mail: SentMail | None = _parse_send_email(body)
            parse_error: SesError | None = None
        except RefusedRequest as exc:
            mail, parse_error = None, SesError(exc.code, exc.status, exc.message)
        with self._cond:
            self._requests += 1
            now = time.monotonic()
            if mail is not None:
                mail = dataclasses.replace(mail, monotonic=now, wall_time=time.time(), user_agent=user_agent)
            verdict = self._decide(mail, parse_error, now)
            if verdict is None:
                assert mail is not None
                self._sent.append(mail)
                n = mail.recipient_count
                self._second.append((now, n))
                self._second_sum += n
                self._day.append((now, n))
                self._day_sum += n
                answer = _json_answer(200, {"MessageId": mail.message_id})
            else:
                reason, error = verdict
                self._rejections.append(Rejection(now, time.time(), reason, error, mail))
                answer = _error_answer(error)
            self._cond.notify_all()
        if verdict is None and self.events is not None and mail is not None:
            for record in simulator_events(mail):
                self.events.emit(record)
        if self.latency > 0 and answer.delay == 0:
            answer = dataclasses.replace(answer, delay=self.latency)
        return answer

    def _decide(
        self, mail: SentMail | None, parse_error: SesError | None, now: float
    ) -> tuple[RejectReason, SesError] | None:
        if self._queued:
            return "injected", self._queued.popleft()
        if parse_error is not None or mail is None:
            return "invalid", parse_error or Faults.BAD_REQUEST
        for rule in list(self._rules):
            if rule.predicate(mail):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._rules.remove(rule)
                return "rule", rule.error
        if self._paused is not None:
            return "paused", self._paused
        if self._verified is not None:
            sender = parseaddr(mail.from_address or "")[1].lower()
            domain = sender.rpartition("@")[2]
            if sender not in self._verified and domain not in self._verified:
                return "unverified", Faults.MESSAGE_REJECTED.with_message(
                    "Email address is not verified. The following identities failed the check in region "
                    f"US-EAST-1: {mail.from_address}"
                )
        config_set = mail.configuration_set_name
        if self._configuration_sets is not None and config_set not in (None, *self._configuration_sets):
            return "not_found", Faults.NOT_FOUND.with_message(
                f"Configuration set <{mail.configuration_set_name}> does not exist."
            )
        if mail.tenant_name is not None:
            aggregate = self.tenancy.aggregate(mail.tenant_name)
            if aggregate is None and self._strict_tenants:
                return "not_found", Faults.NOT_FOUND.with_message(
                    f"Tenant <{mail.tenant_name}> does not exist."
                )
            if aggregate == "DISABLED":
                return "paused", Faults.SENDING_PAUSED.with_message(
                    f"Sending is paused for tenant {mail.tenant_name}."
                )
        if self.validate:
            problem = _validation_problem(mail)
            if problem is not None:
                return "invalid", Faults.BAD_REQUEST.with_message(problem)
        n = mail.recipient_count
        self._prune(now)
        if self.enforce_daily and self._baseline_24h + self._day_sum + n > self._max_24_hour_send:
            return "daily", Faults.LIMIT_EXCEEDED
        if self.enforce_rate and self._second_sum + n > self._max_send_rate:
            return "rate", Faults.TOO_MANY_REQUESTS
        return None

    def _prune(self, now: float) -> None:
        while self._second and self._second[0][0] <= now - 1.0:
            self._second_sum -= self._second.popleft()[1]
        while self._day and self._day[0][0] <= now - _DAY:
            self._day_sum -= self._day.popleft()[1]


def max_in_window(
    mails: Iterable[SentMail], seconds: float, key: Callable[[SentMail], Hashable] | None = None
) -> int:
    """Most recipients in any half-open window ``[t, t + seconds)`` of ``SentMail.monotonic``.

    Mails exactly ``seconds`` apart fall in different windows. With ``key``
    (e.g. ``lambda m: m.tenant_name`` or ``lambda m: m.tag("x")``), windows
    are counted per key value and the largest of them is returned.
    """
    by_key = max_in_window_by(mails, seconds, key if key is not None else (lambda _mail: None))
    return max(by_key.values(), default=0)


def max_in_window_by(
    mails: Iterable[SentMail], seconds: float, key: Callable[[SentMail], Hashable]
) -> dict[Hashable, int]:
    """Per value of ``key``, most recipients in any window ``[t, t + seconds)``."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    groups: dict[Hashable, list[SentMail]] = defaultdict(list)
    for mail in sorted(mails, key=lambda m: m.monotonic):
        groups[key(mail)].append(mail)
    return {k: _max_window(group, seconds) for k, group in groups.items()}


def _max_window(mails: list[SentMail], seconds: float) -> int:
    """Sliding two pointers over mails sorted by time."""
    best = total = start = 0
    for mail in mails:
        total += mail.recipient_count
        while mail.monotonic - mails[start].monotonic >= seconds:
            total -= mails[start].recipient_count
            start += 1
        best = max(best, total)
    return best


# -- wire format ---------------------------------------------------------------------------


def _json_answer(status: int, payload: Mapping[str, Any]) -> _Answer:
    return _Answer(status, json.dumps(payload).encode())


def _error_answer(error: SesError) -> _Answer:
    if error.action != "answer":
        return _Answer(0, b"", action=error.action, delay=error.delay)
    if error.code is None:
        html = f"<html><body><b>Http/1.1 {error.message}</b></body></html>"
        return _Answer(error.status, html.encode(), content_type="text/html", delay=error.delay)
    return _Answer(
        error.status,
        json.dumps({"message": error.message}).encode(),
        error_type=error.code + _ERROR_TYPE_SUFFIX,
        delay=error.delay,
    )


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _refused(Faults.BAD_REQUEST.with_message(f"{what} must be a list of strings"))
    return tuple(value)


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _parse_send_email(body: bytes) -> SentMail:
    try:
        request = json.loads(body or b"{}")
    except ValueError as exc:
        raise _refused(SesError("SerializationException", 400, f"Malformed JSON: {exc}")) from None
    if not isinstance(request, dict):
        raise _refused(SesError("SerializationException", 400, "Expected a JSON object"))
    destination = request.get("Destination")
    destination = destination if isinstance(destination, dict) else None
    content = request.get("Content")
    if not isinstance(content, dict):
        raise _refused(Faults.BAD_REQUEST.with_message("Content is required"))
    kinds = [k for k in ("Simple", "Raw", "Template") if isinstance(content.get(k), dict)]
    if len(kinds) != 1:
        raise _refused(
            Faults.BAD_REQUEST.with_message("Content must have exactly one of Simple, Raw or Template")
        )
    from_address = _opt_str(request.get("FromEmailAddress"))
    to = _strings(destination.get("ToAddresses"), "ToAddresses") if destination else ()
    cc = _strings(destination.get("CcAddresses"), "CcAddresses") if destination else ()
    bcc = _strings(destination.get("BccAddresses"), "BccAddresses") if destination else ()
    subject: str | None = None
    raw_data: bytes | None = None
    template_name: str | None = None
    if kinds == ["Simple"]:
        subject_part = content["Simple"].get("Subject")
        subject = _opt_str(subject_part.get("Data")) if isinstance(subject_part, dict) else None
    elif kinds == ["Raw"]:
        encoded = content["Raw"].get("Data")
        if not isinstance(encoded, str):
            raise _refused(Faults.BAD_REQUEST.with_message("Raw.Data is required"))
        try:
            raw_data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise _refused(Faults.BAD_REQUEST.with_message("Raw.Data is not valid base64")) from None
        headers = BytesHeaderParser(policy=policy.default).parsebytes(raw_data)
        header_subject = headers.get("Subject")
        subject = None if header_subject is None else str(header_subject)
        if from_address is None and headers.get("From") is not None:
            from_address = str(headers["From"])
        if destination is None:
            to, cc, bcc = (
                tuple(addr for _, addr in getaddresses([str(h) for h in headers.get_all(name, [])]) if addr)
                for name in ("To", "Cc", "Bcc")
            )
    else:
        template_name = _opt_str(content["Template"].get("TemplateName"))
    tags: dict[str, str] = {}
    raw_tags = request.get("EmailTags")
    if isinstance(raw_tags, list):
        for tag in raw_tags:
            if isinstance(tag, dict) and isinstance(tag.get("Name"), str):
                tags[tag["Name"]] = str(tag.get("Value", ""))
    return SentMail(
        message_id=f"0100{uuid.uuid4().hex[:12]}-{uuid.uuid4()}-000000",
        monotonic=0.0,
        wall_time=0.0,
        from_address=from_address,
        to=to,
        cc=cc,
        bcc=bcc,
        subject=subject,
        raw_size=None if raw_data is None else len(raw_data),
        raw_data=raw_data,
        template_name=template_name,
        tenant_name=_opt_str(request.get("TenantName")),
        configuration_set_name=_opt_str(request.get("ConfigurationSetName")),
        tags=tags,
        reply_to=_strings(request.get("ReplyToAddresses"), "ReplyToAddresses"),
    )


def _address_problem(address: str) -> str | None:
    addr = parseaddr(address)[1]
    local, at, domain = addr.rpartition("@")
    if not at or not local or not domain:
        return f"Missing final '@domain': {address}"
    if any(c.isspace() for c in addr) or "." not in domain:
        return f"Illegal address: {address}"
    return None


def _validation_problem(mail: SentMail) -> str | None:
    if not mail.from_address:
        return "Missing required parameter: FromEmailAddress"
    if mail.recipient_count == 0:
        return "Missing required header 'To'."
    if mail.recipient_count > MAX_RECIPIENTS:
        return f"Recipient count exceeds {MAX_RECIPIENTS}."
    for address in (mail.from_address, *mail.recipients):
        problem = _address_problem(address)
        if problem is not None:
            return problem
    return None


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # socketserver's default listen backlog is 5: a burst of new connections from a few
    # daemons overflows it, the kernel drops the SYNs and each client retries after 1 s,
    # an artefact no real endpoint shows. (Slow answers are wanted on purpose: latency=.)
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: SesServer
    ) -> None:
        self.owner = owner
        self.to_reset: set[object] = set()  # connections to close with RST
        self.to_reset_lock = threading.Lock()
        super().__init__(address, handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """Quiet: a client that went away is not the test's business."""

    def shutdown_request(self, request: Any) -> None:
        with self.to_reset_lock:
            reset = request in self.to_reset
            self.to_reset.discard(request)
        if reset:  # SO_LINGER 0 is set: close() without a shutdown() first sends RST, not FIN
            self.close_request(request)
        else:
            super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms a request).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.owner._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: no request log on stderr."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return b"".join(self._chunks())
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _chunks(self) -> Iterator[bytes]:
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return
            yield self.rfile.read(size)
            self.rfile.readline()

    def _dispatch(self) -> None:
        owner = self.server.owner
        body = self._read_body()
        try:
            user_agent = self.headers.get("User-Agent", "")
            answer = owner._handle(self.command, urlsplit(self.path).path, body, user_agent)
        except Exception as exc:  # e.g. a fail_when predicate that raised: the test must see it
            owner._record_error(exc)
            answer = _error_answer(Faults.INTERNAL_FAILURE.with_message(f"SesServer error: {exc!r}"))
        if answer.delay > 0 and owner._stopping.wait(answer.delay):
            self.close_connection = True
            return
        if answer.action != "answer":
            self.close_connection = True
            if answer.action == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                with self.server.to_reset_lock:
                    self.server.to_reset.add(self.connection)
            return
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        if answer.error_type is not None:
            self.send_header("x-amzn-ErrorType", answer.error_type)
        self.end_headers()
        self.wfile.write(answer.body)
