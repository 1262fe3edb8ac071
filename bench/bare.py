"""The floor for CPU per mail: a bare script that makes only the unavoidable calls.

``python -m bench.bare`` moves ``--mails`` mails through the same services as
the daemon, with the same message bodies, in the same batches, but with no
logic around the calls: per batch of ten, one Redis call to take the jobs,
one ``SendMessageBatch``, one Redis call to record the hand-off; per
receive, one ``ReceiveMessage``, one quota script call per tenant in it, one
``SendEmail`` per mail, one Redis call to record the sends and one
``DeleteMessageBatch``. No retries, no error handling, no metrics, no logs.
It prints one JSON line: the CPU seconds (user + system) and the wall time
of the work, set-up excluded.

The endpoints come from the standard AWS variables; ``--redis``,
``--queue-url`` and ``--tenants`` say where and how much.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
import uuid
from collections import defaultdict
from typing import Any

import redis.asyncio

from bench.load import mail
from fairpost.config.limits import Window
from fairpost.config.sections import TenantSettings
from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.aws import SES_CONFIG, SQS_CONFIG, session
from fairpost.mailer.quota.engine import quota_script
from fairpost.mailer.sdk import envelope
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import validate

WINDOWS = (Window(1, 1_000_000), Window(86_400, 100_000_000))
RECEIVERS = 2


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(redis_url: str, queue_url: str, mails: int, tenants: int) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(redis_url)
    prefix = f"bare-{uuid.uuid4().hex[:6]}"
    queue_key = f"{prefix}:queue"
    # Set-up, not measured: the jobs, as the SDK stores their payloads.
    async with client.pipeline(transaction=False) as pipe:
        for n in range(mails):
            _, payload = validate(mail(n), max_bytes=200_000)
            job_id = uuid.uuid4().hex
            pipe.rpush(queue_key, json.dumps([job_id, f"t{n % tenants}", payload]))
        await pipe.execute()
    quota = client.register_script(quota_script("acquire"))
    keys = MailKeys(prefix)
    tenant_settings = TenantSettings()
    sent = 0
    done = asyncio.Event()
    aws = session()
    async with (
        aws.client("sqs", config=SQS_CONFIG) as sqs,
        aws.client("sesv2", config=SES_CONFIG) as ses_client,
    ):
        await sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
        await ses_client.get_account()

        async def hand_off() -> None:
            while True:
                raw: list[bytes] | None = await client.lpop(queue_key, 10)  # type: ignore[assignment]
                if not raw:
                    return
                jobs = [json.loads(r) for r in raw]
                entries = [
                    {
                        "Id": str(i),
                        "MessageBody": envelope.encode(job_id, tenant, int(time.time() * 1000), payload),
                        "MessageGroupId": tenant,
                        "MessageDeduplicationId": job_id,
                    }
                    for i, (job_id, tenant, payload) in enumerate(jobs)
                ]
                await sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
                async with client.pipeline(transaction=False) as pipe:
                    for job_id, _, _ in jobs:
                        pipe.hset(keys.job(job_id), "state", "dispatched")
                    await pipe.execute()

        async def send() -> None:
            nonlocal sent
            while not done.is_set():
                response = await sqs.receive_message(
                    QueueUrl=queue_url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=1,
                    MessageSystemAttributeNames=["MessageGroupId"],
                )
                messages = response.get("Messages", [])
                if not messages:
                    continue
                groups: dict[str, list[envelope.Envelope]] = defaultdict(list)
                for m in messages:
                    env = envelope.decode(m["Body"])
                    groups[env.tenant].append(env)
                for tenant, envs in groups.items():
                    args: list[Any] = ["acquire", "", 20, len(WINDOWS)]
                    for w in WINDOWS * 2:
                        args += [w.seconds, w.limit]
                    args += [len(envs), *(e.mail.recipients for e in envs)]
                    qkeys = [keys.quota("global", w.seconds) for w in WINDOWS]
                    qkeys += [keys.quota(f"t:{tenant}", w.seconds) for w in WINDOWS]
                    # An acquire's record goes last, as the daemon's (acquire.lua).
                    qkeys.append(keys.quota_grant(uuid.uuid4().hex))
                    await quota(keys=qkeys, args=args)
                all_envs = [e for envs in groups.values() for e in envs]
                await asyncio.gather(
                    *(ses_client.send_email(**ses.send_email_request(e, tenant_settings)) for e in all_envs)
                )
                async with client.pipeline(transaction=False) as pipe:
                    for e in all_envs:
                        pipe.hset(keys.job(e.job_id), "state", "sent")
                    await pipe.execute()
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
                ]
                await sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
                sent += len(messages)
                if sent >= mails:
                    done.set()

        cpu0, wall0 = cpu_seconds(), time.monotonic()
        await asyncio.gather(hand_off(), *(send() for _ in range(RECEIVERS)))
        cpu, wall = cpu_seconds() - cpu0, time.monotonic() - wall0
    await client.aclose()
    return {"mails": sent, "cpu_seconds": cpu, "seconds": wall}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bare")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--queue-url", required=True)
    parser.add_argument("--mails", type=int, required=True)
    parser.add_argument("--tenants", type=int, default=10)
    args = parser.parse_args()
    result = asyncio.run(run(args.redis, args.queue_url, args.mails, args.tenants))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
