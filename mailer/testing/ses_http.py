"""SES v2's answers over HTTP, for :class:`~fairpost.mailer.testing.ses_server.SesServer`.

The server itself is :class:`~fairpost.mailer.testing.http_endpoint.HttpEndpoint`;
:func:`json_answer` and :func:`error_answer` write its answers as SES v2 does:
a JSON body, and an error's code in ``x-amzn-ErrorType``, or (a fault that is
no answer) a delay, a closed connection or a reset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fairpost.mailer.testing.http_endpoint import Answer
from fairpost.mailer.testing.ses_mail import Faults, SesError

__all__ = ["error_answer", "internal_error", "json_answer"]

_ERROR_TYPE_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.aws.services.email/"


def json_answer(status: int, payload: Mapping[str, Any]) -> Answer:
    return Answer(status, json.dumps(payload).encode())


def error_answer(error: SesError) -> Answer:
    if error.action != "answer":
        return Answer(0, b"", action=error.action, delay=error.delay)
    if error.code is None:
        html = f"<html><body><b>Http/1.1 {error.message}</b></body></html>"
        return Answer(error.status, html.encode(), content_type="text/html", delay=error.delay)
    return Answer(
        error.status,
        json.dumps({"message": error.message}).encode(),
        headers={"x-amzn-ErrorType": error.code + _ERROR_TYPE_SUFFIX},
        delay=error.delay,
    )


def internal_error(exc: Exception) -> Answer:
    """The answer to a request the server failed on: a 500 ``InternalFailure``."""
    return error_answer(Faults.INTERNAL_FAILURE.with_message(f"SesServer error: {exc!r}"))
