"""The webhook endpoints' delivery queues in Redis: the one owner of their format.

Each endpoint has a queue of its own (``deliveries.lua`` says what it is), so
one tenant's slow or dead endpoint holds only its own deliveries. Every change
is one Lua script beside this module:

- ``fanout.lua``: the feed's events, in order, to their tenants' endpoints
  (one batch at a time over every replica: a cursor compared and moved);
- ``claim.lua``: due deliveries, fairly over endpoints, each under a lease, at
  most a cap in flight per endpoint over every replica;
- ``settle.lua``: what one attempt came to (delivered, retry at, given up, gone);
- ``reap.lua``: deliveries whose lease ran out, due again;
- ``replay.lua``: past events queued again at one endpoint, with their ids.

This module builds each script's KEYS and ARGV and reads its answer; the
daemon's delivery loop (``mailer/daemon/webhooks``) and the admin
(:mod:`.endpoints`) only send the calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.feed import Outcome

__all__ = ["Claimed", "DeliveryCalls", "claimed", "script"]

Args = list[str | int]
Call = tuple[list[str], Args]

OUTCOMES = ("delivered", "retry", "given_up", "gone")
"""What an attempt can come to (settle.lua)."""


def script(name: str) -> str:
    """``<name>.lua`` beside this module, after the queue's shared steps (deliveries.lua)."""
    package = "fairpost.mailer.sdk.outcomes"
    return lua_source(package, "deliveries") + "\n" + lua_source(package, name)


@dataclass(frozen=True)
class Claimed:
    """A delivery claimed for one attempt, with what the attempt needs of its endpoint."""

    endpoint: str
    event_id: str
    body: str
    tries: int
    """Attempts made before this one."""
    tenant: str
    url: str
    secrets: tuple[str, ...]
    """The endpoint's secret, then its previous one while the rotation overlap lasts."""

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed

    @property
    def job_id(self) -> str:
        return str(self.event.get("data", {}).get("job_id", ""))

    @property
    def type(self) -> str:
        return str(self.event.get("type", ""))


def claimed(flat: Sequence[Any]) -> list[Claimed]:
    """claim.lua's answer: eight values per delivery."""
    out = []
    for i in range(0, len(flat), 8):
        endpoint, event_id, body, tries, tenant, url, secret, old = (text(v) for v in flat[i : i + 8])
        secrets = (secret, old) if old else (secret,)
        out.append(Claimed(endpoint, event_id, body, int(tries), tenant, url, secrets))
    return out


class DeliveryCalls:
    """Builds each delivery script's KEYS and ARGV (see each ``.lua`` file's header)."""

    def __init__(self, keys: MailKeys) -> None:
        self.keys = keys

    def _loop_keys(self) -> list[str]:
        k = self.keys
        return [k.webhook_ready(), k.webhook_inflight(), k.webhook_busy(), k.webhook_wake()]

    def fanout(self, cursor: str, events: Sequence[Outcome] | None, last_id: str) -> Call:
        """``events`` None: the batch without its events (no endpoint is expected)."""
        k = self.keys
        keys = [k.webhook_cursor(), k.webhook_endpoints(), k.webhook_ready(), k.webhook_wake()]
        args: Args = [cursor, last_id, k.webhook_endpoint_prefix(), k.webhook_tenant("")]
        args.append("1" if events is None else "0")
        for event in events or ():
            args += [event.id, _ms(event.id), event.tenant, event.type, event.job_id, event.body()]
        return keys, args

    def claim(self, most: int, cap: int, lease_ms: int, endpoints: int) -> Call:
        k = self.keys
        keys = [k.webhook_ready(), k.webhook_inflight(), k.webhook_busy()]
        return keys, [k.webhook_endpoint_prefix(), most, cap, lease_ms, endpoints]

    def settle(
        self,
        delivery: Claimed,
        outcome: str,
        *,
        retry_in_ms: int,
        record: dict[str, Any],
        disable_after_ms: int,
        kept: int,
    ) -> Call:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        args: Args = [
            self.keys.webhook_endpoint_prefix(), delivery.endpoint, delivery.event_id, delivery.job_id,
            outcome, retry_in_ms, delivery.tries + 1, json.dumps(record, separators=(",", ":")),
            disable_after_ms, kept,
        ]  # fmt: skip
        return self._loop_keys(), args

    def reap(self, most: int) -> Call:
        return self._loop_keys(), [self.keys.webhook_endpoint_prefix(), most]

    def replay(self, endpoint: str, events: Sequence[Outcome]) -> Call:
        k = self.keys
        keys = [k.webhook_ready(), k.webhook_wake(), k.webhook_endpoint(endpoint)]
        args: Args = [k.webhook_endpoint_prefix(), endpoint]
        for event in events:
            args += [event.id, _ms(event.id), event.job_id, event.body()]
        return keys, args

    def queue_keys(self, endpoint: str) -> list[str]:
        """Every key of an endpoint's queue (for removing it)."""
        parts = ("body", "pending", "due", "tail", "next", "tries", "attempts")
        return [self.keys.webhook_part(endpoint, part) for part in parts]


def _ms(event_id: str) -> int:
    return int(event_id.partition("-")[0])
