"""``fairpost run``'s tracing set-up (issue 30, items 1 and 5): on and off from the
standard OTEL_* variables only, and, through a real daemon process, spans that
reach an OTLP/HTTP collector carrying the application's trace."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from fairpost import MailClient
from fairpost.config import ConfigError, load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.daemon import tracing as daemon_tracing
from fairpost.mailer.daemon.tracing import exporter_names, from_env
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.daemon_process import daemon_process
from tests.tracing.otlp_receiver import OtlpReceiver, otlp_receiver

QUEUE = "fairpost-mail.fifo"


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp_proto_http", "console"]),
        # A collector named turns the specification's default exporter (otlp) on.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp_proto_http"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["otlp_proto_http"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ["otlp_proto_grpc"]),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            ["otlp_proto_http"],
        ),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, []),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, []),
    ],
)
def test_the_standard_variables_choose_the_exporters(environ: dict[str, str], names: list[str]) -> None:
    assert exporter_names(environ) == names


@pytest.mark.parametrize("value", [None, "none"])
def test_unconfigured_or_none_the_daemon_traces_nothing(
    value: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is not None:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    assert from_env(load_settings()) is None


CONSOLE_RUN = textwrap.dedent(
    """
    from fairpost.config import load_settings
    from fairpost.mailer.daemon.tracing import from_env
    tracing = from_env(load_settings())
    assert tracing is not None
    tracing.tracer.start_span("a span of the daemon").end()
    tracing.close()  # exports what is left
    """
)


def console_output(**environ: str) -> str:
    """What ``fairpost run``'s set-up prints with OTEL_TRACES_EXPORTER=console (its own stdout)."""
    result = subprocess.run(
        [sys.executable, "-c", CONSOLE_RUN],
        env={**os.environ, "OTEL_TRACES_EXPORTER": "console", **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_console_prints_the_daemons_spans_as_service_fairpost() -> None:
    out = console_output()
    assert '"name": "a span of the daemon"' in out
    assert '"service.name": "fairpost"' in out


def test_otel_service_name_names_the_service() -> None:
    assert '"service.name": "mail-eu"' in console_output(OTEL_SERVICE_NAME="mail-eu")


def test_trace_parent_is_fairposts_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("FAIRPOST_TRACE_PARENT", "true")
    tracing = from_env(load_settings())
    assert tracing is not None and tracing.parent
    tracing.close()


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaegerish"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
    ],
)
def test_what_cannot_be_set_up_is_refused_naming_the_variable(
    environ: dict[str, str], variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        from_env(load_settings())
    assert [name for name, _ in raised.value.problems] == [variable]


def test_asking_for_traces_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_tracing, "INSTALLED", False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    with pytest.raises(ConfigError, match=r"pip install 'fairpost\[otel\]'"):
        from_env(load_settings())


def test_fairpost_run_refuses_an_unknown_exporter(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", redis_url)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaegerish")
    assert main(["run"]) == 1
    assert "OTEL_TRACES_EXPORTER: unknown exporter 'jaegerish'" in capsys.readouterr().err


# -- a real daemon, a real collector ---------------------------------------------


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture
def daemon_env(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, ses_env: SesServer, receiver: OtlpReceiver
) -> dict[str, str]:
    for name, value in {
        "FAIRPOST_REDIS_URL": redis_url,
        "FAIRPOST_SENDER__WAIT_SECONDS": "1",
        "FAIRPOST_TENANT_LIMITS": "1/second",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["init-aws"]) == 0
    return {
        **os.environ,
        # Only the collector is named: OTLP over HTTP, the specification's default.
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


@pytest.mark.slow
def test_a_daemon_process_sends_the_applications_trace_to_an_otlp_collector(
    daemon_env: dict[str, str],
    receiver: OtlpReceiver,
    tmp_path: Path,
    app_tracer: trace.Tracer,
) -> None:
    with daemon_process(daemon_env, tmp_path, replica="traced") as daemon:
        with MailClient(load_settings()) as client, app_tracer.start_as_current_span("POST /signup") as app:
            ids = client.send_many(
                "acme",
                [{"sender": "app@acme.example", "to": ["ada@example.org"], "subject": "Hi", "text": "x"}] * 2,
            )

        def sent(job_id: str) -> bool:
            return any(
                s.attributes.get("fairpost.job_id") == job_id and s.attributes.get("fairpost.state") == "sent"
                for s in receiver.named("process ")
            )

        wait_for(
            lambda: all(sent(job_id) for job_id in ids), within=30, what="the daemon's spans at the collector"
        )
        assert daemon.stop() == 0
    app_trace = app.get_span_context().trace_id
    processes = receiver.named("process ")
    assert {s.service for s in receiver.spans} == {"fairpost"}
    for job_id in ids:
        [process] = [s for s in processes if s.attributes["fairpost.job_id"] == job_id]
        assert process.kind == SpanKind.CONSUMER.value + 1  # OTLP counts from UNSPECIFIED = 0
        assert process.attributes["fairpost.tenant_id"] == "acme"
        assert [link[0] for link in process.links] == [app_trace]
        [call] = [s for s in receiver.named("SESv2.SendEmail") if s.attributes["fairpost.job_id"] == job_id]
        assert call.parent_span_id == process.span_id and call.attributes["aws.ses.message_id"]
        assert [link[0] for link in call.links] == [app_trace]
    # The tenant's quota (one a second) made one of the two wait.
    waits = [attrs for s in processes for name, attrs in s.events if name == "fairpost.wait"]
    assert waits and {w["fairpost.wait_reason"] for w in waits} == {"tenant_quota"}
    handoffs = receiver.named(f"send {QUEUE}")
    assert handoffs and all(s.attributes["messaging.system"] == "aws_sqs" for s in handoffs)
    assert {link[0] for s in handoffs for link in s.links} == {app_trace}
