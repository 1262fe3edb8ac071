"""A queue ``RedrivePolicy`` that a throttled tenant's mail reaches.

SQS moves a message to the policy's dead-letter queue after
``maxReceiveCount`` receives. fairpost parks a tenant over its quota by
extending the visibility of the message it just received, so every park is
a receive: a tenant that stays throttled runs its mail's receive count up
while fairpost still holds the job, and SQS takes the message away (the
reconciler then hands the job to SQS again, mailer/daemon/reconcile.py).
fairpost counts attempts itself and dead-letters what it cannot send or
read, so its queue needs no redrive policy.

Nothing here imports AWS: the attributes come from whoever asked SQS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

SHORTEST_PARK_SECONDS = 2.0
"""The shortest quota wait the sender parks in SQS (a receive each time): shorter
ones it times itself (fairpost.mailer.daemon.parking.PRECISE_WAIT_MAX, the same number)."""

_DEFAULT_RETENTION = 345_600
"""SQS's default MessageRetentionPeriod (4 days), for attributes that lack it."""


def redrive_warning(attributes: Mapping[str, str]) -> str | None:
    """What is wrong with the queue's RedrivePolicy, and what to set; None if nothing."""
    raw = attributes.get("RedrivePolicy")
    if not raw:
        return None
    try:
        policy = json.loads(raw)
        max_receives = int(policy["maxReceiveCount"])
    except (ValueError, KeyError, TypeError):
        return f"the queue's RedrivePolicy is not readable ({raw!r}): remove it"
    dlq = str(policy.get("deadLetterTargetArn", "")).rsplit(":", 1)[-1] or "its dead-letter queue"
    retention = int(attributes.get("MessageRetentionPeriod") or _DEFAULT_RETENTION)
    reachable = int(retention // SHORTEST_PARK_SECONDS)
    if max_receives > reachable:
        return None
    return (
        f"the queue's RedrivePolicy moves a message to {dlq} after {max_receives} receives, and "
        "every quota park is a receive: a throttled tenant's mail can be received about "
        f"{reachable:,} times within the retention ({_duration(retention)}), so SQS would take mail "
        "fairpost still holds (its reconciler hands it over again, FAIRPOST_RECONCILE_HANDOFFS "
        "times, then dead-letters it). Set: remove the RedrivePolicy (fairpost counts attempts "
        "itself and dead-letters what it cannot send), or, if a policy must stay, maxReceiveCount "
        "1000 (SQS's most) with FAIRPOST_RECONCILE_HANDOFFS above 0"
    )


def _duration(seconds: int) -> str:
    if seconds % 86400 == 0:
        days = seconds // 86400
        return f"{days} day" + ("" if days == 1 else "s")
    return f"{seconds:,} s"
