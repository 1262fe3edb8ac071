"""What the ``fairpost`` commands print: JSON for ``--json``, one-line errors."""

from __future__ import annotations

import json
import sys
from typing import Any

from fairpost.config import Settings, mask_url
from fairpost.dispatcher.access import access_denied


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def fail(message: str) -> int:
    """Say what went wrong on stderr, in one line; the exit code is 1."""
    print(f"fairpost: {message}", file=sys.stderr)
    return 1


def unreachable_redis(settings: Settings, exc: BaseException) -> int:
    denied = access_denied(exc, settings)
    if denied is not None:  # the settings are wrong, not Redis away
        return fail(str(denied))
    return fail(f"cannot use Redis at {mask_url(settings.redis_url)}: {exc}")


def aws_error(exc: BaseException) -> int | None:
    """A one-line message for a botocore error (botocore is not imported: the SDK
    alone installed has none); None for anything else."""
    if not type(exc).__module__.startswith(("botocore", "aiobotocore")):
        return None
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""
    if code in {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}:
        return fail("the SQS queue does not exist yet: run `fairpost init-aws` first")
    if type(exc).__name__ == "NoRegionError":
        return fail("no AWS region: set AWS_DEFAULT_REGION (or AWS_REGION)")
    if type(exc).__name__ == "NoCredentialsError":
        return fail("no AWS credentials: set them as for any boto3 program (variables, profile, role)")
    return fail(f"AWS: {exc}")
