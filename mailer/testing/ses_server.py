"""A recording, fault-injecting Amazon SES v2 server for tests and benchmarks.

moto's SES v2 has no ``GetAccount`` and never enforces a quota or answers an
error, so the sender's tests talk to this instead: a real HTTP server (standard
library only, one thread per connection) that speaks SES v2's REST-JSON wire
protocol well enough for botocore's ``sesv2`` client. Point a client at it with
``endpoint_url=ses.url`` or ``AWS_ENDPOINT_URL_SESV2=ses.url``.

It answers these operations (and SES v2 tenants and reputation entities:
:mod:`fairpost.mailer.testing.ses_tenancy`; and publishes SES events to SQS:
:mod:`fairpost.mailer.testing.ses_publishing`):

- ``SendEmail`` (``POST /v2/email/outbound-emails``): 200 ``{"MessageId": ...}``
  and a :class:`SentMail` recorded, or an error answer exactly as SES v2 sends
  one (status code, ``x-amzn-ErrorType`` header, ``{"message": ...}`` body),
  which botocore raises as ``ClientError`` with that ``Error.Code``.
- ``GetAccount`` (``GET /v2/email/account``): the account's ``SendQuota``, with
  ``SentLast24Hours`` counting the recipients recorded here.
- ``GetEmailIdentity``: :mod:`fairpost.mailer.testing.ses_identities`.

Errors come from, in this order: an outage (:meth:`SesServer.go_down`, which
answers every operation, GetAccount too), queued faults (:meth:`SesServer.fail_next`),
rules (:meth:`SesServer.fail_when`), a paused account (:meth:`SesServer.pause`),
an unverified sender (``require_verified``), an unknown configuration set or
tenant (``configuration_sets`` / ``tenants``), a malformed request (no sender,
no recipients, an address without ``@domain``, more than 50 recipients), the
24-hour quota and the per-second rate (see ``enforce_rate``). Quotas count
recipients, as SES does.

Its parts live beside it, and every public name is importable from here: the
requests, mails, errors and window counts in :mod:`fairpost.mailer.testing.ses_mail`,
the HTTP in :mod:`fairpost.mailer.testing.ses_http`, what it recorded (with
the waits on it) in :mod:`fairpost.mailer.testing.ses_record`, and the faults a
test injects in :mod:`fairpost.mailer.testing.ses_faults`.

Example::

    with SesServer(max_send_rate=10) as ses:
        client = boto3.client("sesv2", endpoint_url=ses.url, ...)
        ses.fail_next(2, Faults.TOO_MANY_REQUESTS)
        ...
        ses.wait_for(100, timeout=10)
        assert ses.max_in_window(1.0, key=lambda m: m.tenant_name) <= 2
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Iterable
from email.utils import parseaddr
from typing import Any, ClassVar

from fairpost.mailer.errors import RefusedRequest
from fairpost.mailer.testing.http_endpoint import Answer, HttpEndpoint, Request
from fairpost.mailer.testing.ses_faults import FaultRule, SesFaults
from fairpost.mailer.testing.ses_http import error_answer, internal_error, json_answer
from fairpost.mailer.testing.ses_identities import IDENTITIES_PATH, identity_answer
from fairpost.mailer.testing.ses_mail import (
    JOB_ID_TAG,
    MAX_RECIPIENTS,
    Faults,
    Rejection,
    RejectReason,
    SentMail,
    SesError,
    max_in_window,
    max_in_window_by,
    parse_send_email,
    validation_problem,
)
from fairpost.mailer.testing.ses_publishing import EventSink, ses_event, simulator_events
from fairpost.mailer.testing.ses_tenancy import TenantBook

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

SEND_EMAIL_PATH = "/v2/email/outbound-emails"
ACCOUNT_PATH = "/v2/email/account"
_DAY = 86_400.0


class SesServer(SesFaults):
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
        super().__init__()
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

        self._second: deque[tuple[float, int]] = deque()
        self._second_sum = 0
        self._day: deque[tuple[float, int]] = deque()
        self._day_sum = 0

        self._http = HttpEndpoint(self._answer, self._failed, name="ses-server")

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> SesServer:
        self._http.start()
        return self

    def stop(self) -> None:
        if not self._http.running:
            return
        self._http.stop()
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> SesServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._http.port

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
    def max_send_rate(self) -> float:
        with self._cond:
            return self._max_send_rate

    @property
    def max_24_hour_send(self) -> float:
        with self._cond:
            return self._max_24_hour_send

    def sent_last_24_hours(self) -> float:
        """What GetAccount reports as ``SentLast24Hours`` now."""
        with self._cond:
            self._prune(time.monotonic())
            return self._baseline_24h + self._day_sum

    # -- request handling (handler threads) ------------------------------------------------

    def emit(
        self, event_type: str, message_id: str, recipients: Iterable[str] | None = None, **options: Any
    ) -> None:
        """Publish an SES event (``Bounce``, ``Complaint``, ``Delivery``, ``Reject``,
        ``DeliveryDelay``) for a recorded mail to :attr:`events`."""
        assert self.events is not None, "set SesServer.events to an EventSink first"
        mail = next(m for m in self.sent if m.message_id == message_id)
        listed = mail.recipients if recipients is None else tuple(recipients)
        self.events.emit(ses_event(event_type, mail, listed, **options))

    def _answer(self, request: Request) -> Answer:
        user_agent = request.headers.get("user-agent", "")
        return self._handle(request.method, request.path, request.body, user_agent)

    def _failed(self, exc: Exception) -> Answer:
        self._record_error(exc)
        return internal_error(exc)

    def _handle(self, method: str, path: str, body: bytes, user_agent: str = "") -> Answer:
        with self._cond:
            down = self._down
            if down is not None and path == ACCOUNT_PATH:
                self._account_requests += 1
        if down is not None and path != SEND_EMAIL_PATH:  # SendEmail records its refusal
            return error_answer(down)
        if self.tenancy.handles(path):
            try:
                status, payload = self.tenancy.handle(method, path, body)
            except RefusedRequest as exc:
                return error_answer(SesError(exc.code, exc.status, exc.message))
            except ValueError as exc:
                return error_answer(SesError("SerializationException", 400, f"Malformed JSON: {exc}"))
            return json_answer(status, payload)
        if path == SEND_EMAIL_PATH and method == "POST":
            return self._send_email(body, user_agent)
        if path == ACCOUNT_PATH and method == "GET":
            return self._get_account()
        if path.startswith(IDENTITIES_PATH) and method == "GET":
            return identity_answer(path, self._verified)
        if path in (SEND_EMAIL_PATH, ACCOUNT_PATH):
            return error_answer(SesError("MethodNotAllowedException", 405, f"{method} not allowed"))
        return error_answer(
            SesError("UnknownOperationException", 404, f"SesServer does not implement {method} {path}")
        )

    def _get_account(self) -> Answer:
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
        return json_answer(200, payload)

    def _send_email(self, body: bytes, user_agent: str = "") -> Answer:
        if self.arrival_delay > 0:
            with self._cond:
                self._arrivals += 1
                delayed = self._arrivals % self.arrival_delay_every == 0
            if delayed:
                time.sleep(self.arrival_delay)  # this request's own handler thread
        try:
            mail: SentMail | None = parse_send_email(body)
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
                answer = json_answer(200, {"MessageId": mail.message_id})
            else:
                reason, error = verdict
                self._rejections.append(Rejection(now, time.time(), reason, error, mail))
                answer = error_answer(error)
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
        if self._down is not None:
            return "down", self._down
        if self._queued:
            return "injected", self._queued.popleft()
        if parse_error is not None or mail is None:
            return "invalid", parse_error or Faults.BAD_REQUEST
        ruled = self._ruled(mail)
        if ruled is not None:
            return "rule", ruled
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
            problem = validation_problem(mail)
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
