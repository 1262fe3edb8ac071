"""Load for the scenarios (through the SDK, as an application would) and what SES saw of it."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fairpost import AsyncMailClient, Mail
from fairpost.config import Settings
from fairpost.mailer.errors import TimedOut
from fairpost.mailer.testing.ses_server import SentMail, SesServer
from fairpost.mailer.testing.wait import wait_for_async

TENANT_TAG = "fairpost-tenant"


def mail(n: int, recipients: int = 1, *, stream: str = "transactional") -> Mail:
    """A bench mail; a ``notification`` (one recipient) has the topic ``digest``."""
    return Mail(
        sender="app@bench.example",
        to=[f"user{n}.{r}@example.org" for r in range(recipients)],
        subject=f"bench {n}",
        text="A benchmark mail.\n",
        stream=stream,
        topic="digest" if stream == "notification" else None,
    )


@dataclass
class Enqueued:
    tenant: str
    at: float
    """Wall time (``time.time()``) the SDK call returned."""


@dataclass
class Load:
    """Enqueues through :class:`AsyncMailClient` and remembers what and when."""

    settings: Settings
    jobs: dict[str, Enqueued] = field(default_factory=dict)
    _client: AsyncMailClient | None = None
    _n: int = 0

    async def __aenter__(self) -> Load:
        self._client = AsyncMailClient(self.settings)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()

    @property
    def client(self) -> AsyncMailClient:
        assert self._client is not None, "use Load as an async context manager"
        return self._client

    async def burst(
        self, tenant: str, count: int, *, chunk: int = 200, stream: str = "transactional"
    ) -> list[str]:
        """``count`` mails for ``tenant`` at once, in SDK calls of ``chunk``."""
        ids: list[str] = []
        while len(ids) < count:
            n = min(chunk, count - len(ids))
            mails = [mail(self._n + i, stream=stream) for i in range(n)]
            self._n += n
            new = await self.client.send_many(tenant, mails)
            now = time.time()
            for job_id in new:
                self.jobs[job_id] = Enqueued(tenant, now)
            ids += new
        return ids

    async def one(self, tenant: str) -> str:
        self._n += 1
        job_id = (await self.client.send_many(tenant, [mail(self._n)]))[0]
        self.jobs[job_id] = Enqueued(tenant, time.time())
        return job_id

    async def steady(self, rates: Mapping[str, float], seconds: float, *, seed: int = 7) -> int:
        """Poisson arrivals at ``rates`` (mails per second per tenant), one SDK call per mail."""
        rng = random.Random(seed)
        arrivals: list[tuple[float, str]] = []
        for tenant, rate in sorted(rates.items()):
            t = rng.expovariate(rate)
            while t < seconds:
                arrivals.append((t, tenant))
                t += rng.expovariate(rate)
        arrivals.sort()
        start = time.monotonic()
        for offset, tenant in arrivals:
            delay = start + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.one(tenant)
        return len(arrivals)

    def ids(self, tenants: Iterable[str] | None = None) -> list[str]:
        wanted = None if tenants is None else set(tenants)
        return [j for j, e in self.jobs.items() if wanted is None or e.tenant in wanted]


def by_job(sent: list[SentMail]) -> dict[str, list[SentMail]]:
    out: dict[str, list[SentMail]] = defaultdict(list)
    for m in sent:
        out[m.job_id or ""].append(m)
    return out


def loss_and_duplicates(load: Load, sent: list[SentMail]) -> tuple[int, int, int]:
    """(enqueued mails never sent, mails sent more than once, sends of unknown jobs)."""
    seen = by_job(sent)
    lost = sum(1 for j in load.jobs if j not in seen)
    duplicates = sum(1 for sends in seen.values() if len(sends) > 1)
    unknown = sum(len(v) for j, v in seen.items() if j not in load.jobs)
    return lost, duplicates, unknown


def latencies(
    load: Load, sent: list[SentMail], tenants: Iterable[str], since: float, until: float
) -> list[float]:
    """Enqueue → first SES arrival, in seconds, of the tenants' mails enqueued in [since, until).

    A mail not sent at all counts as infinitely late.
    """
    first: dict[str, float] = {}
    for m in sent:
        if m.job_id and m.job_id not in first:
            first[m.job_id] = m.wall_time
    wanted = set(tenants)
    out = []
    for job_id, e in load.jobs.items():
        if e.tenant in wanted and since <= e.at < until:
            out.append(first[job_id] - e.at if job_id in first else math.inf)
    return out


def sent_by_tenant(sent: list[SentMail], since: float, until: float) -> Counter[str]:
    """Recipients SES accepted per tenant with arrival wall time in [since, until)."""
    counts: Counter[str] = Counter()
    for m in sent:
        if since <= m.wall_time < until:
            counts[m.tag(TENANT_TAG) or ""] += m.recipient_count
    return counts


async def wait_sent(ses: SesServer, count: int, *, within: float) -> bool:
    """Wait until SES has accepted ``count`` mails; False after ``within`` seconds."""
    try:
        await wait_for_async(lambda: ses.sent_count >= count, within=within, what=f"{count} mails at SES")
    except TimedOut:
        return False
    return True
