"""Contract tests: the SQS FIFO rules fairpost relies on, checked against every emulator.

``emulators()`` builds the parameters of the ``fifo_emulator`` fixture, so that a
test can mark the emulator that breaks its rule (``indirect=True``).
"""

from __future__ import annotations

import pytest
from _pytest.mark.structures import ParameterSet

EMULATORS = ("moto", "localstack", "fifo_sqs")


def emulators(
    *,
    moto_breaks: str | None = None,
    moto_flaky: str | None = None,
    localstack_breaks: str | None = None,
    fifo_sqs_breaks: str | None = None,
) -> list[ParameterSet]:
    """Parameters for ``fifo_emulator``: moto, LocalStack (behind the ``localstack`` marker)
    and fairpost's own SQS (mailer/testing/sqs_server.py).

    ``moto_breaks``: moto breaks this rule every time (strict xfail, so a fix is noticed).
    ``moto_flaky``: moto breaks it only when a race goes its way (non-strict xfail).
    ``localstack_breaks``: LocalStack breaks this rule every time (strict xfail).
    ``fifo_sqs_breaks``: fairpost's own SQS breaks this rule (strict xfail; none does today).
    """
    moto_marks: list[pytest.MarkDecorator] = []
    if moto_breaks is not None:
        moto_marks.append(pytest.mark.xfail(strict=True, reason=f"moto 5.x: {moto_breaks}"))
    if moto_flaky is not None:
        moto_marks.append(pytest.mark.xfail(strict=False, reason=f"moto 5.x (race-dependent): {moto_flaky}"))
    localstack_marks = [pytest.mark.localstack, pytest.mark.timeout(300)]
    if localstack_breaks is not None:
        localstack_marks.append(
            pytest.mark.xfail(strict=True, reason=f"LocalStack 4.12: {localstack_breaks}")
        )
    fifo_sqs_marks: list[pytest.MarkDecorator] = []
    if fifo_sqs_breaks is not None:
        fifo_sqs_marks.append(pytest.mark.xfail(strict=True, reason=f"fifo_sqs: {fifo_sqs_breaks}"))
    return [
        pytest.param("moto", id="moto", marks=moto_marks),
        # The first LocalStack test of a session may have to install it first (about 45 s).
        pytest.param("localstack", id="localstack", marks=localstack_marks),
        pytest.param("fifo_sqs", id="fifo_sqs", marks=fifo_sqs_marks),
    ]
