"""AWS clients, configured on purpose.

Endpoints, region and credentials come from the standard variables boto3
reads (``AWS_ENDPOINT_URL_SQS``, ``AWS_DEFAULT_REGION``, …); fairpost adds
none. botocore's own retries are limited: left at their defaults they
retry a throttled SES send by themselves, hiding the throttle from the
quota engine and the metrics.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import botocore
from botocore.config import Config


def _user_agent() -> str:
    """Who calls AWS, as AWS support and CloudTrail show it: fairpost and its
    version, then botocore's and Python's. Given whole, it also spares botocore
    building its own header from a dozen cleaned-up parts twice a request, which
    was about 7 % of a replica's CPU (``python -m bench.profile``)."""
    try:
        ours = version("fairpost")
    except PackageNotFoundError:  # run from a source tree that was never installed
        ours = "dev"
    return f"fairpost/{ours} botocore/{botocore.__version__} Python/{platform.python_version()}"


USER_AGENT = _user_agent()

# SES: one attempt; the sender decides what a failure means (refund, back off).
SES_CONFIG = Config(
    retries={"total_max_attempts": 1, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    user_agent=USER_AGENT,
)

# SQS: a couple of quick retries for connection blips; the read timeout must
# outlast a 20-second long poll.
SQS_CONFIG = Config(
    retries={"max_attempts": 3, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=50,
    user_agent=USER_AGENT,
)

# aioboto3 clients are untyped; this alias marks where they are used.
SqsClient = Any
SesClient = Any


def session() -> Any:
    import aioboto3

    return aioboto3.Session()
