"""Blocking AWS clients of a sending pool (#43), for the operator's commands.

The default pool's clients read the ``AWS_*`` variables, as they always did;
another pool's take its region, credentials (a profile, static keys, or a role
assumed once: a command is short-lived) and endpoints (config/pools.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fairpost.config import Settings
from fairpost.config.pools import PoolSettings

__all__ = ["pool_client"]


@contextlib.contextmanager
def pool_client(settings: Settings, pool: str, service: str, config: Any = None) -> Iterator[Any]:
    """A boto3 client of ``service`` (``sqs``, ``sesv2``) in the pool's account and region."""
    import boto3

    own = settings.pools.get(pool)
    if own is None:
        client = boto3.client(service, config=config)
    else:
        endpoint = own.ses_endpoint_url if service == "sesv2" else own.sqs_endpoint_url
        extra = {} if endpoint is None else {"endpoint_url": endpoint}
        client = _session(boto3, own).client(service, config=config, **extra)
    try:
        yield client
    finally:
        client.close()


def _session(boto3: Any, pool: PoolSettings) -> Any:
    session = boto3.Session(**pool.session_args())
    if pool.role_arn is None:
        return session
    args = pool.assume_role_args("fairpost-cli")
    extra = {} if pool.sqs_endpoint_url is None else {"endpoint_url": pool.sqs_endpoint_url}
    sts = session.client("sts", **extra)
    try:
        found = sts.assume_role(**args)["Credentials"]
    finally:
        sts.close()
    return boto3.Session(
        region_name=pool.region,
        aws_access_key_id=found["AccessKeyId"],
        aws_secret_access_key=found["SecretAccessKey"],
        aws_session_token=found["SessionToken"],
    )
