"""``fairpost doctor``'s AWS checks: the SQS queue (exists, FIFO, its attributes) and the SES
account (sending enabled, production access, quotas against the configured limits).

boto3 reads region, endpoints and credentials from the standard ``AWS_*`` variables,
as the daemon does. With the SDK alone installed (no boto3) they warn: not checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fairpost.config import Settings
from fairpost.config.limits import Window
from fairpost.config.pools import DEFAULT_POOL, pool_settings
from fairpost.mailer.ops.doctor_check import Check, Verdict
from fairpost.mailer.ops.pool_aws import pool_client

__all__ = ["aws_checks"]

_DAY = 86_400
_NO_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}


def aws_checks(settings: Settings, pool: str = DEFAULT_POOL) -> list[Check]:
    """The pool's queue and SES account (config/pools.py); another pool than the default
    names itself in each check's area (``sqs:eu``)."""
    try:
        import boto3  # noqa: F401  (pool_client's: without it, a warning, not a failure)
        from botocore.config import Config
    except ImportError:
        return [
            Check(
                "aws",
                "installed",
                "warn",
                "SQS and SES not checked: boto3 is not installed",
                "pip install 'fairpost[daemon]'",
            )
        ]
    quick = Config(connect_timeout=3, read_timeout=10, retries={"total_max_attempts": 2})
    checks = []
    own = pool_settings(settings, pool)
    for area, service, step in (("sqs", "sqs", _sqs), ("ses", "sesv2", _ses)):
        try:
            with pool_client(settings, pool, service, quick) as client:
                checks += step(own, client)
        except Exception as exc:  # no region, no credentials, refused, unreachable
            checks.append(Check(area, "reach", "fail", _aws_problem(exc), _aws_fix(area, exc)))
    if pool == DEFAULT_POOL:
        return checks
    return [dataclasses.replace(check, area=f"{check.area}:{pool}") for check in checks]


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _aws_problem(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _aws_fix(area: str, exc: Exception) -> str:
    name, code = type(exc).__name__, _code(exc)
    if name == "NoRegionError":
        return "set AWS_DEFAULT_REGION (or AWS_REGION)"
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return "give this process AWS credentials (variables, profile, instance or pod role)"
    if "AccessDenied" in code or "NotAuthorized" in code:
        actions = "sqs:GetQueueUrl, sqs:GetQueueAttributes" if area == "sqs" else "ses:GetAccount"
        return f'allow {actions} to this role (docs/operations.md, "IAM permissions")'
    return "check the AWS endpoint and network (AWS_ENDPOINT_URL_* for an emulator)"


def _sqs(settings: Settings, sqs: Any) -> list[Check]:
    from fairpost.mailer.ops.queue_setup import queue_warnings, wanted_attributes

    checks = [_queue(sqs, settings.queue_name, wanted_attributes(settings), queue_warnings)]
    if settings.events_queue_name:
        checks.append(_queue(sqs, settings.events_queue_name, None, None))
    return checks


def _queue(
    sqs: Any,
    name: str,
    wanted: dict[str, str] | None,
    warnings: Callable[[Any, str], list[str]] | None,
) -> Check:
    """A queue exists; with ``wanted``: it is FIFO and its attributes are fairpost's."""
    what = "queue" if wanted is not None else "events-queue"
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    except Exception as exc:
        if _code(exc) not in _NO_QUEUE:
            raise
        return Check("sqs", what, "fail", f"{name} does not exist", "fairpost init-aws (--events)")
    if wanted is None:
        return Check("sqs", what, "pass", f"{name} exists")
    have = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    if have.get("FifoQueue") != "true":
        return Check("sqs", what, "fail", f"{name} is not a FIFO queue", "a FIFO queue named *.fifo")
    differ = [
        f"{attr} is {have.get(attr, '(unset)')}, fairpost wants {want}"
        for attr, want in wanted.items()
        if have.get(attr) != want
    ]
    problems = differ + (warnings(sqs, url) if warnings else [])
    if problems:
        return Check(
            "sqs",
            what,
            "warn",
            f"{name}: " + "; ".join(problems),
            "set these attributes on the queue (fairpost init-aws creates them so)",
        )
    return Check("sqs", what, "pass", f"{name}: FIFO, attributes as fairpost wants them")


def _ses(settings: Settings, ses: Any) -> list[Check]:
    account = ses.get_account()
    checks = [_sending(account)]
    quota = account.get("SendQuota", {})
    rate, daily = float(quota.get("MaxSendRate", 0)), float(quota.get("Max24HourSend", 0))
    detail = f"{rate:g} a second, {daily:g} a day, {float(quota.get('SentLast24Hours', 0)):g} sent in 24 h"
    verdict: Verdict = "pass"
    fix = ""
    if settings.global_limits != "auto":
        over = [f"{w.limit} per {w.seconds} s" for w in settings.global_limits if _beyond(w, rate, daily)]
        if over:
            verdict, fix = "warn", "lower FAIRPOST_GLOBAL_LIMITS, or set it to auto"
            detail += f"; FAIRPOST_GLOBAL_LIMITS allows more: {', '.join(over)} (SES would throttle)"
    checks.append(Check("ses", "quota", verdict, detail, fix))
    return checks


def _beyond(window: Window, rate: float, daily: float) -> bool:
    """A configured global window allows more than SES's quota."""
    if window.seconds < _DAY:
        return window.limit / window.seconds > rate
    return daily > 0 and window.limit > daily * window.seconds / _DAY


def _sending(account: dict[str, Any]) -> Check:
    status = account.get("EnforcementStatus", "HEALTHY")
    if not account.get("SendingEnabled", True) or status == "SHUTDOWN":
        return Check(
            "ses",
            "account",
            "fail",
            f"sending is disabled (enforcement status {status})",
            "see the SES console's reputation page, then: aws sesv2 put-account-sending-attributes",
        )
    if not account.get("ProductionAccessEnabled", False):
        return Check(
            "ses",
            "account",
            "warn",
            "in the SES sandbox: mail only to verified addresses",
            "request production access in the SES console",
        )
    if status != "HEALTHY":
        return Check("ses", "account", "warn", f"enforcement status {status}", "see SES's reputation page")
    return Check("ses", "account", "pass", "sending enabled, production access")
