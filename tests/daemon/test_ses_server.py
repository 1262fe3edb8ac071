"""The SES v2 test server, driven by real botocore / aiobotocore ``sesv2`` clients over HTTP."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

from fairpost.mailer.testing import ses_server as ses_server_module
from fairpost.mailer.testing.ses_server import (
    JOB_ID_TAG,
    Faults,
    SentMail,
    SesError,
    SesServer,
    max_in_window,
    max_in_window_by,
)

# total_max_attempts=1 is what makes botocore try once: retries={"max_attempts": 1} means
# one *retry* (see test_botocore_max_attempts_means_retries).
ONE_ATTEMPT = Config(
    retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=10
)
SIMPLE = {"Simple": {"Subject": {"Data": "Hello"}, "Body": {"Text": {"Data": "Body"}}}}


def sesv2(url: str, config: Config = ONE_ATTEMPT) -> Any:
    return boto3.client(
        "sesv2",
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=config,
    )


def send(ses_client: Any, to: list[str] | None = None, **extra: Any) -> str:
    response = ses_client.send_email(
        FromEmailAddress=extra.pop("FromEmailAddress", "sender@example.com"),
        Destination={"ToAddresses": to or ["rcpt@example.org"]},
        Content=extra.pop("Content", SIMPLE),
        **extra,
    )
    message_id: str = response["MessageId"]
    return message_id


@pytest.fixture
def ses_client(ses: SesServer) -> Any:
    return sesv2(ses.url)


# -- SendEmail and GetAccount ---------------------------------------------------------------


def test_simple_send_is_recorded_with_every_field(ses: SesServer, ses_client: Any) -> None:
    before_mono, before_wall = time.monotonic(), time.time()
    message_id = ses_client.send_email(
        FromEmailAddress="Acme <noreply@acme.example>",
        Destination={
            "ToAddresses": ["a@example.org", "b@example.org"],
            "CcAddresses": ["c@example.org"],
            "BccAddresses": ["d@example.org"],
        },
        ReplyToAddresses=["help@acme.example"],
        Content=SIMPLE,
        TenantName="acme",
        ConfigurationSetName="cs-acme",
        EmailTags=[{"Name": JOB_ID_TAG, "Value": "job-42"}, {"Name": "tenant", "Value": "acme"}],
    )["MessageId"]
    after_mono, after_wall = time.monotonic(), time.time()

    [mail] = ses.sent
    assert mail.message_id == message_id
    assert before_mono <= mail.monotonic <= after_mono
    assert before_wall <= mail.wall_time <= after_wall
    assert mail.from_address == "Acme <noreply@acme.example>"
    assert mail.to == ("a@example.org", "b@example.org")
    assert mail.cc == ("c@example.org",)
    assert mail.bcc == ("d@example.org",)
    assert mail.reply_to == ("help@acme.example",)
    assert mail.recipient_count == 4
    assert mail.subject == "Hello"
    assert mail.raw_size is None and mail.raw_data is None
    assert mail.tenant_name == "acme"
    assert mail.configuration_set_name == "cs-acme"
    assert mail.tags == {JOB_ID_TAG: "job-42", "tenant": "acme"}
    assert mail.job_id == "job-42"
    assert mail.tag("tenant") == "acme"
    assert (ses.sent_count, ses.requests, ses.rejected_count, ses.recipients_sent) == (1, 1, 0, 4)


def test_message_ids_are_unique(ses: SesServer, ses_client: Any) -> None:
    ids = {send(ses_client) for _ in range(20)}
    assert len(ids) == 20
    assert {m.message_id for m in ses.sent} == ids


def test_raw_send_takes_recipients_from_headers_unless_destination_given(
    ses: SesServer, ses_client: Any
) -> None:
    raw = (
        b"From: Acme <noreply@acme.example>\r\nTo: A <a@example.org>, b@example.org\r\n"
        b"Cc: c@example.org\r\nSubject: =?utf-8?q?Caf=C3=A9?=\r\n\r\n" + b"x" * 5000
    )
    ses_client.send_email(Content={"Raw": {"Data": raw}}, EmailTags=[{"Name": JOB_ID_TAG, "Value": "j1"}])
    send(ses_client, to=["only@example.org"], Content={"Raw": {"Data": raw}})

    from_headers, with_destination = ses.sent
    assert from_headers.raw_size == len(raw)
    assert from_headers.raw_data == raw
    assert from_headers.subject == "Café"
    assert from_headers.from_address == "Acme <noreply@acme.example>"
    assert from_headers.to == ("a@example.org", "b@example.org")
    assert from_headers.cc == ("c@example.org",)
    assert from_headers.recipient_count == 3
    assert from_headers.job_id == "j1"
    assert with_destination.from_address == "sender@example.com"
    assert with_destination.recipients == ("only@example.org",)


def test_template_send_records_the_template(ses: SesServer, ses_client: Any) -> None:
    send(ses_client, Content={"Template": {"TemplateName": "welcome", "TemplateData": "{}"}})
    assert ses.sent[0].template_name == "welcome"
    assert ses.sent[0].subject is None


def test_get_account_reports_quotas_and_recipients_sent() -> None:
    with SesServer(max_send_rate=25, max_24_hour_send=1000, sent_last_24_hours=7, enforce_rate=False) as ses:
        ses_client = sesv2(ses.url)
        send(ses_client, to=["a@example.org", "b@example.org"])
        account = ses_client.get_account()
        assert account["SendQuota"] == {"Max24HourSend": 1000.0, "MaxSendRate": 25.0, "SentLast24Hours": 9.0}
        assert account["SendingEnabled"] is True
        assert account["ProductionAccessEnabled"] is True
        assert account["DedicatedIpAutoWarmupEnabled"] is False
        assert account["EnforcementStatus"] == "HEALTHY"
        assert ses.account_requests == 1
        assert ses.requests == 1  # GetAccount is not a SendEmail

        ses.set_quota(max_send_rate=50, max_24_hour_send=200_000)
        ses.pause()
        account = ses_client.get_account()
        assert account["SendQuota"]["MaxSendRate"] == 50.0
        assert account["SendQuota"]["Max24HourSend"] == 200_000.0
        assert account["SendingEnabled"] is False
        ses.pause(Faults.ACCOUNT_SUSPENDED)
        assert ses_client.get_account()["EnforcementStatus"] == "SHUTDOWN"


def test_default_quotas_are_reported_but_not_enforced(ses: SesServer, ses_client: Any) -> None:
    quota = ses_client.get_account()["SendQuota"]
    assert (quota["MaxSendRate"], quota["Max24HourSend"]) == (14.0, 50_000.0)
    for _ in range(20):
        send(ses_client)
    assert ses.sent_count == 20 and ses.rejected_count == 0


def test_found_through_the_standard_endpoint_variable(
    ses: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", ses.url)
    ses_client = boto3.client(
        "sesv2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y", config=ONE_ATTEMPT
    )
    send(ses_client)
    assert ses.sent_count == 1


# -- errors ---------------------------------------------------------------------------------

ANSWERED = [error for error in Faults.all() if not error.is_network_error]


@pytest.mark.parametrize("error", ANSWERED, ids=lambda e: f"{e.code}-{e.status}")
def test_injected_error_surfaces_as_client_error(ses: SesServer, ses_client: Any, error: SesError) -> None:
    ses.fail_next(1, error)
    with pytest.raises(ClientError) as caught:
        send(ses_client)
    response = caught.value.response
    assert response["Error"]["Code"] == (error.code or str(error.status))
    assert response["Error"]["Message"] == error.message
    assert response["ResponseMetadata"]["HTTPStatusCode"] == error.status
    assert ses.sent_count == 0 and ses.requests == 1
    [rejection] = ses.rejections
    assert (rejection.reason, rejection.error, rejection.code) == ("injected", error, error.code)
    assert rejection.mail is not None and rejection.mail.to == ("rcpt@example.org",)

    send(ses_client)  # the fault was used up
    assert ses.sent_count == 1


def test_every_error_fairpost_handles_is_covered() -> None:
    codes = {error.code for error in Faults.all()}
    assert {
        "TooManyRequestsException",
        "LimitExceededException",
        "SendingPausedException",
        "AccountSuspendedException",
        "MessageRejected",
        "MailFromDomainNotVerifiedException",
        "BadRequestException",
        "NotFoundException",
        "InternalServiceErrorException",
        "InternalFailure",
        "ServiceUnavailable",
    } <= codes
    statuses = {(e.code, e.status) for e in Faults.all()}
    assert ("TooManyRequestsException", 429) in statuses
    assert ("NotFoundException", 404) in statuses
    assert ("ServiceUnavailable", 503) in statuses
    # Every modeled code is one botocore knows for SendEmail (plus the generic ones).
    model = boto3.client("sesv2", region_name="us-east-1").meta.service_model
    modeled = {shape.name for shape in model.operation_model("SendEmail").error_shapes}
    generic = {
        None,
        "InternalServiceErrorException",
        "InternalFailure",
        "ServiceUnavailable",
        "AccessDeniedException",
    }
    assert codes - generic <= modeled


def test_modeled_errors_map_to_botocore_exception_classes(ses: SesServer, ses_client: Any) -> None:
    ses.fail_next(1, Faults.TOO_MANY_REQUESTS)
    with pytest.raises(ses_client.exceptions.TooManyRequestsException):
        send(ses_client)
    ses.fail_next(1, Faults.SENDING_PAUSED)
    with pytest.raises(ses_client.exceptions.SendingPausedException):
        send(ses_client)


@pytest.mark.parametrize("error", [Faults.DROP_CONNECTION, Faults.RESET_CONNECTION], ids=["close", "reset"])
def test_dropped_connection_is_a_botocore_connection_error(
    ses: SesServer, ses_client: Any, error: SesError
) -> None:
    send(ses_client)  # a pooled keep-alive connection exists; the fault hits a request on it
    ses.fail_next(1, error)
    with pytest.raises(ConnectionClosedError):
        send(ses_client)
    assert ses.sent_count == 1 and ses.requests == 2
    assert ses.rejections[0].error == error
    send(ses_client)  # the ses_client reconnects, the server goes on
    assert ses.sent_count == 2


def test_reset_sends_rst(ses: SesServer) -> None:
    ses.fail_next(1, Faults.RESET_CONNECTION)
    body = b'{"Content": {"Simple": {}}, "Destination": {"ToAddresses": ["a@b.org"]}}'
    with socket.create_connection(("127.0.0.1", ses.port), timeout=5) as sock:
        request = f"POST /v2/email/outbound-emails HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(request.encode() + body)
        with pytest.raises(ConnectionResetError):
            sock.recv(1024)


def test_delayed_fault_trips_the_read_timeout(ses: SesServer) -> None:
    ses_client = sesv2(ses.url, ONE_ATTEMPT.merge(Config(read_timeout=0.3)))
    ses.fail_next(1, Faults.TOO_MANY_REQUESTS.delayed(2))
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        send(ses_client)
    assert time.monotonic() - started < 1.5


def test_latency_delays_every_answer() -> None:
    with SesServer(latency=0.2) as ses:
        ses_client = sesv2(ses.url)
        started = time.monotonic()
        send(ses_client)
        assert time.monotonic() - started >= 0.2


def test_fail_next_queues_n_errors_in_order(ses: SesServer, ses_client: Any) -> None:
    ses.fail_next(2, Faults.TOO_MANY_REQUESTS)
    ses.fail_next(1, Faults.SERVICE_UNAVAILABLE)
    codes = []
    for _ in range(4):
        try:
            send(ses_client)
            codes.append("ok")
        except ClientError as exc:
            codes.append(exc.response["Error"]["Code"])
    assert codes == ["TooManyRequestsException", "TooManyRequestsException", "ServiceUnavailable", "ok"]
    assert (ses.requests, ses.sent_count, ses.rejected_count) == (4, 1, 3)


def test_fail_when_picks_requests_by_recipient_and_tenant(ses: SesServer, ses_client: Any) -> None:
    ses.fail_when(lambda m: "bounce@example.org" in m.recipients, Faults.MESSAGE_REJECTED)
    limited = ses.fail_when(lambda m: m.tenant_name == "noisy", Faults.TOO_MANY_REQUESTS, times=2)

    with pytest.raises(ClientError, match="MessageRejected"):
        send(ses_client, to=["ok@example.org", "bounce@example.org"])
    send(ses_client, to=["ok@example.org"])
    for _ in range(2):
        with pytest.raises(ClientError, match="TooManyRequestsException"):
            send(ses_client, TenantName="noisy")
    assert limited.remaining == 0
    send(ses_client, TenantName="noisy")  # the rule fired its two times
    send(ses_client, TenantName="quiet")
    assert [m.tenant_name for m in ses.sent] == [None, "noisy", "quiet"]
    assert [r.reason for r in ses.rejections] == ["rule"] * 3


def test_fail_when_can_be_cancelled_and_faults_cleared(ses: SesServer, ses_client: Any) -> None:
    rule = ses.fail_when(lambda m: True, Faults.INTERNAL_FAILURE)
    with pytest.raises(ClientError):
        send(ses_client)
    rule.cancel()
    send(ses_client)
    ses.fail_next(5, Faults.PLAIN_500)
    ses.fail_when(lambda m: True, Faults.INTERNAL_FAILURE)
    ses.pause()
    ses.clear_faults()
    send(ses_client)
    assert ses.sent_count == 2


def test_a_failing_predicate_is_a_500_and_is_kept(ses: SesServer, ses_client: Any) -> None:
    def broken(mail: SentMail) -> bool:
        raise KeyError("oops")

    ses.fail_when(broken, Faults.MESSAGE_REJECTED)
    with pytest.raises(ClientError) as caught:
        send(ses_client)
    assert caught.value.response["Error"]["Code"] == "InternalFailure"
    assert [type(e) for e in ses.errors] == [KeyError]


def test_pause_rejects_every_send_until_resumed(ses: SesServer, ses_client: Any) -> None:
    ses.pause()
    assert ses.paused
    for _ in range(3):
        with pytest.raises(ses_client.exceptions.SendingPausedException):
            send(ses_client)
    ses.resume()
    send(ses_client)
    assert (ses.sent_count, ses.rejected_count) == (1, 3)
    assert {r.reason for r in ses.rejections} == {"paused"}


def test_going_down_fails_every_operation_until_faults_are_cleared(ses: SesServer, ses_client: Any) -> None:
    ses.go_down()
    for call in (lambda: send(ses_client), ses_client.get_account):
        with pytest.raises(ClientError) as caught:
            call()
        assert caught.value.response["Error"]["Code"] == "ServiceUnavailable"
    ses.clear_faults()
    send(ses_client)
    assert ses_client.get_account()["SendingEnabled"]
    assert ses.account_requests == 2
    assert (ses.sent_count, [r.reason for r in ses.rejections]) == (1, ["down"])


def test_unverified_sender_is_rejected_when_verification_is_required() -> None:
    with SesServer(require_verified={"verified@example.com", "acme.example"}) as ses:
        ses_client = sesv2(ses.url)
        send(ses_client, FromEmailAddress="verified@example.com")
        send(ses_client, FromEmailAddress="Acme <anyone@acme.example>")  # verified domain
        with pytest.raises(ClientError) as caught:
            send(ses_client, FromEmailAddress="stranger@example.net")
        assert caught.value.response["Error"]["Code"] == "MessageRejected"
        assert "Email address is not verified" in caught.value.response["Error"]["Message"]
        ses.verify("stranger@example.net")
        send(ses_client, FromEmailAddress="stranger@example.net")
        assert ses.sent_count == 3


def test_any_sender_is_accepted_by_default(ses: SesServer, ses_client: Any) -> None:
    send(ses_client, FromEmailAddress="whoever@anywhere.example")
    assert ses.sent_count == 1


@pytest.mark.parametrize(
    ("to", "expected"),
    [
        (["no-at-sign"], "Missing final '@domain'"),
        ([f"r{i}@example.org" for i in range(51)], "Recipient count exceeds 50."),
    ],
    ids=["malformed", "too-many"],
)
def test_invalid_requests_are_bad_requests(
    ses: SesServer, ses_client: Any, to: list[str], expected: str
) -> None:
    with pytest.raises(ClientError) as caught:
        send(ses_client, to=to)
    assert caught.value.response["Error"]["Code"] == "BadRequestException"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert expected in caught.value.response["Error"]["Message"]
    assert ses.rejections[0].reason == "invalid"
    send(ses_client, to=[f"r{i}@example.org" for i in range(50)])


def test_unknown_configuration_set_or_tenant_is_not_found() -> None:
    with SesServer(configuration_sets={"cs"}, tenants={"acme"}) as ses:
        ses_client = sesv2(ses.url)
        send(ses_client, ConfigurationSetName="cs", TenantName="acme")
        send(ses_client)
        unknown: list[dict[str, Any]] = [{"ConfigurationSetName": "nope"}, {"TenantName": "nope"}]
        for extra in unknown:
            with pytest.raises(ses_client.exceptions.NotFoundException):
                send(ses_client, **extra)
        assert ses.sent_count == 2


def test_botocore_max_attempts_means_retries(ses: SesServer) -> None:
    """retries={"max_attempts": 1} is one retry: a throttle is sent twice and may be hidden."""
    ses_client = sesv2(ses.url, Config(retries={"max_attempts": 1, "mode": "standard"}))
    ses.fail_next(1, Faults.TOO_MANY_REQUESTS)
    send(ses_client)  # the retry succeeded: the caller never saw the throttle
    assert (ses.requests, ses.sent_count) == (2, 1)


# -- quotas, windows ------------------------------------------------------------------------


class Clock:
    """The recording server's clock, moved by the test alone: its windows do not
    depend on how fast the machine answers."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def time() -> float:
        return time.time()


def test_rate_enforcement_rejects_the_excess_in_any_second(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(ses_server_module, "time", clock)
    with SesServer(max_send_rate=5) as ses:
        ses_client = sesv2(ses.url)
        send(ses_client, to=[f"a{i}@example.org" for i in range(3)])
        clock.now += 0.5
        send(ses_client, to=["b1@example.org", "b2@example.org"])  # 5 of 5
        clock.now += 0.49
        with pytest.raises(ClientError) as caught:
            send(ses_client, to=["c@example.org"])  # 6 > 5
        assert caught.value.response["Error"]["Code"] == "TooManyRequestsException"
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
        assert (ses.sent_count, ses.rejected_count, ses.requests) == (2, 1, 3)
        assert ses.rejections[0].reason == "rate"
        assert ses.max_in_window(1.0) == 5

        clock.now += 0.02  # the first mail leaves the window
        send(ses_client, to=["d@example.org"] * 3)  # 2 + 3 fit
        assert ses.max_in_window(1.0) == 5
        assert ses.max_in_window(10.0) == 8


def test_rate_enforcement_holds_under_concurrent_senders() -> None:
    with SesServer(max_send_rate=10) as ses:
        clients = [sesv2(ses.url) for _ in range(8)]

        def hammer(ses_client: Any) -> None:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                with contextlib.suppress(ClientError):  # throttled: expected
                    send(ses_client, to=["x@example.org", "y@example.org"])

        threads = [threading.Thread(target=hammer, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert ses.rejected_count > 0
        assert 0 < ses.max_in_window(1.0) <= 10
        assert ses.requests == ses.sent_count + ses.rejected_count


def test_daily_quota_is_enforced_with_the_baseline() -> None:
    with SesServer(max_24_hour_send=10, sent_last_24_hours=7) as ses:
        ses_client = sesv2(ses.url)
        send(ses_client, to=["a@example.org", "b@example.org"])  # 9 of 10
        with pytest.raises(ClientError) as caught:
            send(ses_client, to=["c@example.org", "d@example.org"])
        assert caught.value.response["Error"]["Code"] == "LimitExceededException"
        send(ses_client)  # 10 of 10
        assert ses.sent_last_24_hours() == 10
        assert ses_client.get_account()["SendQuota"]["SentLast24Hours"] == 10.0
        assert [r.reason for r in ses.rejections] == ["daily"]


def mail(at: float, recipients: int = 1, tenant: str = "t") -> SentMail:
    return SentMail(
        monotonic=at, to=tuple(f"r{i}@example.org" for i in range(recipients)), tenant_name=tenant
    )


def test_max_in_window_on_a_known_sequence() -> None:
    mails = [
        mail(0.0, 2, "a"),
        mail(0.5, 1, "b"),
        mail(0.9, 3, "a"),
        mail(1.0, 4, "b"),  # exactly 1 s after the first: a new window
        mail(1.45, 1, "a"),
        mail(5.0, 2, "a"),
    ]
    assert max_in_window(mails, 1.0) == 9  # 0.5 .. 1.45: 1 + 3 + 4 + 1
    assert max_in_window(reversed(mails), 1.0) == 9  # order does not matter
    assert max_in_window(mails, 0.5) == 7  # 0.9 .. 1.0 (0.5 and 1.0 are 0.5 apart: separate)
    assert max_in_window(mails, 10.0) == 13
    assert max_in_window(mails, 1.0, key=lambda m: m.tenant_name) == 5  # b: 0.5 and 1.0
    assert max_in_window_by(mails, 1.0, key=lambda m: m.tenant_name) == {"a": 5, "b": 5}
    assert max_in_window_by(mails, 0.45, key=lambda m: m.tenant_name) == {"a": 3, "b": 4}
    assert max_in_window([], 1.0) == 0
    with pytest.raises(ValueError):
        max_in_window(mails, 0)


def test_max_in_window_per_key_on_the_server(ses: SesServer, ses_client: Any) -> None:
    send(ses_client, to=["a@example.org"] * 3, TenantName="acme")
    send(ses_client, to=["b@example.org"], TenantName="globex")
    send(ses_client, to=["c@example.org"] * 2, TenantName="acme")
    assert ses.max_in_window(60) == 6
    assert ses.max_in_window(60, key=lambda m: m.tenant_name) == 5
    assert ses.max_in_window_by(60, key=lambda m: m.tenant_name) == {"acme": 5, "globex": 1}


# -- waiting, threads, lifecycle ------------------------------------------------------------


def test_wait_for_returns_when_the_count_is_reached(ses: SesServer) -> None:
    def later() -> None:
        ses_client = sesv2(ses.url)
        for _ in range(3):
            send(ses_client)

    thread = threading.Thread(target=later)
    thread.start()
    sent = ses.wait_for(3, timeout=10)
    thread.join()
    assert len(sent) >= 3


def test_wait_for_times_out_with_an_assertion_error(ses: SesServer, ses_client: Any) -> None:
    send(ses_client)
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"waiting for 2 sent mails: 1 sent"):
        ses.wait_for(2, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 2


def test_wait_for_requests_counts_rejections(ses: SesServer, ses_client: Any) -> None:
    ses.fail_next(2, Faults.TOO_MANY_REQUESTS)
    for _ in range(2):
        with pytest.raises(ClientError):
            send(ses_client)
    ses.wait_for_requests(2, timeout=1)
    with pytest.raises(AssertionError):
        ses.wait_for_requests(3, timeout=0.1)


def test_concurrent_sends_are_all_recorded(ses: SesServer) -> None:
    per_thread, threads_n = 25, 8
    ids: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        ses_client = sesv2(ses.url)
        for i in range(per_thread):
            message_id = send(ses_client, EmailTags=[{"Name": JOB_ID_TAG, "Value": f"{n}-{i}"}])
            with lock:
                ids.append(message_id)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sent = ses.wait_for(per_thread * threads_n, timeout=10)
    assert sorted(m.message_id for m in sent) == sorted(ids)
    assert len({m.job_id for m in sent}) == per_thread * threads_n
    assert [m.monotonic for m in sent] == sorted(m.monotonic for m in sent)


def test_reset_forgets_everything(ses: SesServer, ses_client: Any) -> None:
    send(ses_client)
    ses.fail_next(1, Faults.TOO_MANY_REQUESTS)
    with pytest.raises(ClientError):
        send(ses_client)
    ses.fail_next(1, Faults.TOO_MANY_REQUESTS)
    ses.reset()
    assert (ses.sent, ses.rejections, ses.requests) == ([], [], 0)
    send(ses_client)
    assert ses_client.get_account()["SendQuota"]["SentLast24Hours"] == 1.0


def test_unknown_route_is_an_error(ses: SesServer) -> None:
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(ses.url + "/v2/email/identities", timeout=5)
    with caught.value:
        assert caught.value.code == 404
        assert caught.value.headers["x-amzn-ErrorType"].startswith("UnknownOperationException")


def test_stops_quickly_with_open_connections_and_pending_delays() -> None:
    ses = SesServer().start()
    ses_client = sesv2(ses.url, ONE_ATTEMPT.merge(Config(read_timeout=30)))
    send(ses_client)  # leaves a keep-alive connection open
    ses.fail_next(1, Faults.TOO_MANY_REQUESTS.delayed(30))
    errors: list[BaseException] = []

    def stuck() -> None:
        try:
            send(ses_client)
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=stuck)
    thread.start()
    ses.wait_for_requests(2, timeout=5)
    started = time.monotonic()
    ses.stop()
    assert time.monotonic() - started < 2
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert errors and isinstance(errors[0], ConnectionClosedError | EndpointConnectionError)
    ses.stop()  # idempotent
    with pytest.raises(RuntimeError):
        _ = ses.url


def test_quiet(ses: SesServer, ses_client: Any, capfd: pytest.CaptureFixture[str]) -> None:
    send(ses_client)
    ses.fail_next(1, Faults.DROP_CONNECTION)
    with pytest.raises(ConnectionClosedError):
        send(ses_client)
    ses.stop()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# -- aiobotocore, which the daemon uses -----------------------------------------------------


async def test_aiobotocore_client(ses: SesServer) -> None:
    import aioboto3

    session = aioboto3.Session()
    async with session.client(
        "sesv2",
        region_name="us-east-1",
        endpoint_url=ses.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=ONE_ATTEMPT,
    ) as aclient:
        response = await aclient.send_email(
            FromEmailAddress="sender@example.com",
            Destination={"ToAddresses": ["a@example.org"]},
            Content={"Raw": {"Data": b"Subject: hi\r\n\r\nbody"}},
            TenantName="acme",
        )
        assert ses.sent[0].message_id == response["MessageId"]
        assert ses.sent[0].subject == "hi"
        account = await aclient.get_account()
        assert account["SendQuota"]["SentLast24Hours"] == 1.0

        ses.fail_next(1, Faults.TOO_MANY_REQUESTS)
        with pytest.raises(ClientError) as caught:
            await aclient.send_email(
                FromEmailAddress="sender@example.com",
                Destination={"ToAddresses": ["a@example.org"]},
                Content=SIMPLE,
            )
        assert caught.value.response["Error"]["Code"] == "TooManyRequestsException"

        # aiohttp reports a dropped connection as ConnectionClosedError or, for a reset,
        # EndpointConnectionError: both are network errors to the sender.
        for fault in (Faults.DROP_CONNECTION, Faults.RESET_CONNECTION):
            ses.fail_next(1, fault)
            with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
                await aclient.send_email(
                    FromEmailAddress="sender@example.com",
                    Destination={"ToAddresses": ["a@example.org"]},
                    Content=SIMPLE,
                )
