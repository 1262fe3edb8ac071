"""The overview's live parts: SES's account (GetAccount) and the backlog over the last hour.

The account is asked at most once every :data:`ACCOUNT_SECONDS`, in a
thread, with short timeouts and no retries, and only where boto3 is installed
and a region is configured: without AWS the panel says so. The sends per
minute are kept in Redis by the daemon (the send history, mailer/sdk/rollups.py);
nothing keeps a history of the backlog, so the console samples it itself
every :data:`SAMPLE_SECONDS` while it runs, and keeps an hour: that chart
starts when the console does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fairpost.dispatcher.backoff import wait_or_stop

__all__ = ["Account", "Samples", "SesAccount"]

log = logging.getLogger("fairpost.console")

ACCOUNT_SECONDS = 60.0
SAMPLE_SECONDS = 5.0
SPAN_SECONDS = 3600.0


@dataclass(frozen=True)
class Account:
    """What GetAccount said, or why there is nothing to show."""

    configured: bool
    max_send_rate: float | None = None
    max_24_hour_send: float | None = None
    sent_last_24_hours: float | None = None
    sending_enabled: bool | None = None
    enforcement: str | None = None
    production: bool | None = None
    problem: str | None = None
    """Why the account could not be read (no region, no credentials, an AWS error)."""

    @property
    def used_share(self) -> float | None:
        if not self.max_24_hour_send or self.sent_last_24_hours is None:
            return None
        return self.sent_last_24_hours / self.max_24_hour_send


class SesAccount:
    def __init__(self, *, refresh_seconds: float = ACCOUNT_SECONDS) -> None:
        self._refresh = refresh_seconds
        self._last: tuple[float, Account] | None = None
        self._client: Any = None
        self._lock = asyncio.Lock()

    async def read(self) -> Account:
        async with self._lock:
            if self._last is not None and time.monotonic() - self._last[0] < self._refresh:
                return self._last[1]
            account = await asyncio.to_thread(self._ask)
            self._last = (time.monotonic(), account)
            return account

    def _ask(self) -> Account:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError, NoRegionError
        except ImportError:
            return Account(False, problem="boto3 is not installed (the daemon extra)")
        try:
            if self._client is None:
                quick = Config(connect_timeout=2, read_timeout=3, retries={"max_attempts": 1})
                self._client = boto3.client("sesv2", config=quick)
            answer = self._client.get_account()
        except NoRegionError:
            return Account(False, problem="no AWS region configured (AWS_DEFAULT_REGION)")
        except (BotoCoreError, ClientError) as exc:
            log.warning("SES GetAccount failed: %s", type(exc).__name__)
            return Account(True, problem=f"SES GetAccount failed: {type(exc).__name__}")
        quota = answer.get("SendQuota") or {}
        return Account(
            True,
            max_send_rate=quota.get("MaxSendRate"),
            max_24_hour_send=quota.get("Max24HourSend"),
            sent_last_24_hours=quota.get("SentLast24Hours"),
            sending_enabled=answer.get("SendingEnabled"),
            enforcement=answer.get("EnforcementStatus"),
            production=answer.get("ProductionAccessEnabled"),
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class Samples:
    """A value (the backlog), as sampled, over the last :data:`SPAN_SECONDS`."""

    def __init__(self, *, every: float = SAMPLE_SECONDS, span: float = SPAN_SECONDS) -> None:
        self.every = every
        self.span = span
        self._samples: deque[tuple[float, float]] = deque(maxlen=int(span / every) + 1)

    def add(self, at: float, per_second: float) -> None:
        self._samples.append((at, per_second))

    def samples(self) -> list[tuple[float, float]]:
        return list(self._samples)

    async def run(self, stop: asyncio.Event, sample: Callable[[], Awaitable[float]]) -> None:
        """Sample until ``stop``; a failed sample (Redis away) leaves a gap, logged once."""
        failing = False
        while not stop.is_set():
            try:
                self.add(time.time(), await sample())
                failing = False
            except Exception as exc:
                if not failing:
                    log.warning("backlog not sampled (the chart has a gap): %s", type(exc).__name__)
                failing = True
            await wait_or_stop(stop, self.every)
