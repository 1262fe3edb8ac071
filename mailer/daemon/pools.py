"""The daemon's sending pools (#43): each served pool's AWS clients, queue and parts.

``fairpost run`` serves the pools ``FAIRPOST_SERVE_POOLS`` names (default: all).
Each pool runs as the single-pool fairpost does (:func:`~fairpost.mailer.daemon.parts.build_parts`
on the pool's settings, :func:`fairpost.config.pools.pool_settings`): its own
dispatcher, sender, gate, reconciler and slot keeper, on its own keys, SQS queue
and SES account. What belongs to the process (signals, the HTTP server, the
webhooks) stays in ``app.py``. The default pool's AWS clients read the ``AWS_*``
variables as always; another pool's take its region, credentials and endpoints.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fairpost.config import Settings
from fairpost.config.pools import DEFAULT_POOL, PoolSettings
from fairpost.mailer.daemon.aws import SES_CONFIG, SQS_CONFIG, SesClient, SqsClient, session

__all__ = ["PoolClients", "pool_clients", "task_name"]

_ROLE_SESSION = "fairpost"


@dataclass(frozen=True)
class PoolClients:
    sqs: SqsClient
    ses: SesClient
    queue_url: str


def task_name(pool: str, task: str) -> str:
    """A pool's task as the daemon names it: the default pool's keep today's names."""
    return task if pool == DEFAULT_POOL else f"{pool}/{task}"


@contextlib.asynccontextmanager
async def pool_clients(settings: Settings, pool: str) -> AsyncIterator[PoolClients]:
    """The pool's SQS and SES clients and its queue's URL, closed on exit."""
    own = settings.pools.get(pool)
    aws = session() if own is None else await _pool_session(own)
    sqs_args = _endpoint(own.sqs_endpoint_url if own else None)
    ses_args = _endpoint(own.ses_endpoint_url if own else None)
    async with (
        aws.client("sqs", config=SQS_CONFIG, **sqs_args) as sqs,
        aws.client("sesv2", config=SES_CONFIG, **ses_args) as ses,
    ):
        if own is not None and own.queue_url:
            queue_url = own.queue_url
        else:
            name = settings.queue_name if own is None else str(own.queue_name)
            queue_url = (await sqs.get_queue_url(QueueName=name))["QueueUrl"]
        yield PoolClients(sqs, ses, queue_url)


def _endpoint(url: str | None) -> dict[str, Any]:
    return {} if url is None else {"endpoint_url": url}


async def _pool_session(pool: PoolSettings) -> Any:
    """An aioboto3 session in the pool's region, with its credentials: a profile, static
    keys, or a role assumed (and assumed again before its credentials expire)."""
    import aioboto3

    base = aioboto3.Session(**pool.session_args())
    if pool.role_arn is None:
        return base
    from aiobotocore.credentials import AioRefreshableCredentials
    from aiobotocore.session import get_session

    async def assume() -> dict[str, str]:
        args = pool.assume_role_args(_ROLE_SESSION)
        async with base.client("sts", **_endpoint(pool.sqs_endpoint_url)) as sts:
            found = (await sts.assume_role(**args))["Credentials"]
        expiry = found["Expiration"]
        if isinstance(expiry, datetime.datetime):
            expiry = expiry.isoformat()
        return {
            "access_key": found["AccessKeyId"],
            "secret_key": found["SecretAccessKey"],
            "token": found["SessionToken"],
            "expiry_time": str(expiry),
        }

    credentials = AioRefreshableCredentials.create_from_metadata(
        metadata=await assume(), refresh_using=assume, method="assume-role"
    )
    core = get_session()
    if pool.region:
        core.set_config_variable("region", pool.region)
    # aiobotocore has no public setter for a session's credentials: its clients read them here.
    core._credentials = credentials
    return aioboto3.Session(botocore_session=core, region_name=pool.region)
