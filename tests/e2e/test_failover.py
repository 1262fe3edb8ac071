"""A Redis failover under load loses nothing: two daemon processes send a multi-tenant
load while the master holding fairpost's data is SIGKILLed (the master of fairpost's
slot in a 6-node cluster; the Sentinel master) and a replica is promoted.

Checked at the SES side (the recording server): every job the SDK accepted is sent
exactly once (or dead with a reason), no sliding window over its limit globally or
per tenant, and the daemons, never restarted, send again within
FAIRPOST_MAX_OUTAGE_SECONDS of the kill. With FAIRPOST_REDIS_MIN_REPLICAS=1 every
write the product relies on is on the replica before it is acted on; the killed node
comes back (as a cluster or a Sentinel deployment replaces it) and rejoins as the
new master's replica, so that writes can be confirmed again.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import RedisError

from fairpost import MailClient
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.localstack import LocalStackServer
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.replicas import (
    accepted,
    application_settings,
    mail,
    make_queue,
    replica_env,
    replicas,
    settled,
    stop_cleanly,
)
from tests.support.topologies import Cluster, Node, SentinelGroup, redis_cluster, redis_sentinel, restart

pytestmark = [pytest.mark.slow, pytest.mark.localstack]

GLOBAL, GLOBAL_LIMIT = "30/second", 30
TENANT, TENANT_LIMIT = "6/second", 6
TRICKLE = ["t1", "t2", "t3", "t4"]
MAX_OUTAGE = 30.0


class Topology:
    """One fresh replicated Redis for the test: its settings, and the failover to cause."""

    def __init__(self, kind: str, server: Cluster | SentinelGroup) -> None:
        self.kind = kind
        self.server = server
        self.killed: Node | None = None

    def env(self) -> dict[str, str]:
        if isinstance(self.server, Cluster):
            return {"FAIRPOST_REDIS_URL": self.server.url, "FAIRPOST_REDIS_CLUSTER": "true"}
        return {
            "FAIRPOST_REDIS_URL": "redis://fairpost-master/0",
            "FAIRPOST_REDIS_SENTINELS": self.server.sentinel_addresses,
            "FAIRPOST_REDIS_SENTINEL_MASTER": "fairpost",
        }

    def master(self) -> Node:
        if isinstance(self.server, Cluster):
            return self.server.node_for(MailKeys().root)
        return self.server.current_master()

    def fail_over(self) -> None:
        """SIGKILL the master, wait for a replica to take over, bring the node back."""
        self.killed = self.master()
        self.killed.kill()
        killed = self.killed
        wait_for(lambda: _promoted(self, killed), within=60, what="a replica promoted", interval=0.2)
        restart(killed)
        replicated = self.server.replicated
        wait_for(replicated, within=60, what="the node back as a replica", interval=0.2)


def _promoted(topology: Topology, killed: Node) -> bool:
    try:
        return topology.master() is not killed
    except (AssertionError, RedisError, StopIteration):
        return False


@pytest.fixture(
    params=[
        pytest.param("cluster", marks=pytest.mark.cluster),
        pytest.param("sentinel", marks=pytest.mark.sentinel),
    ]
)
def topology(request: pytest.FixtureRequest) -> Iterator[Topology]:
    """A topology of its own: the test kills one of its nodes."""
    if request.param == "cluster":
        with redis_cluster() as cluster:
            yield Topology("cluster", cluster)
    else:
        with redis_sentinel() as group:
            yield Topology("sentinel", group)


def test_a_failover_under_load_loses_nothing(
    topology: Topology, localstack_srv: LocalStackServer, ses: SesServer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    env = replica_env(
        ses_url=ses.url,
        sqs_url=localstack_srv.url,
        fairpost={
            **topology.env(),
            "FAIRPOST_REDIS_MIN_REPLICAS": "1",
            "FAIRPOST_REDIS_WAIT_SECONDS": "1",
            "FAIRPOST_MAX_OUTAGE_SECONDS": str(MAX_OUTAGE),
            "FAIRPOST_QUEUE_NAME": f"failover-{uuid.uuid4().hex[:8]}.fifo",
            "FAIRPOST_GLOBAL_LIMITS": GLOBAL,
            "FAIRPOST_TENANT_LIMITS": TENANT,
            "FAIRPOST_INFLIGHT_CAP": "12",
            "FAIRPOST_DISPATCHER__LEASE_SECONDS": "5",
            "FAIRPOST_SENDER__WAIT_SECONDS": "2",
            "FAIRPOST_SENDER__VISIBILITY_TIMEOUT": "20",
            "FAIRPOST_SENDER__BACKOFF_BASE_SECONDS": "1",
            "FAIRPOST_SHUTDOWN_GRACE": "3",
        },
    )
    settings = application_settings(env, monkeypatch)
    make_queue(settings, localstack_srv.url)

    ids: list[str] = []
    failover = threading.Thread(target=topology.fail_over, name="failover")
    with replicas(env, tmp_path) as daemons, MailClient(settings) as client:
        ids += accepted(lambda: client.send_many("noisy", [mail("noisy", i) for i in range(40)]), within=90)
        start = time.monotonic()
        for tick in range(20):
            if tick == 6:
                killed_at = time.monotonic()
                failover.start()
            for tenant in TRICKLE:
                ids += accepted(functools.partial(client.send_many, tenant, [mail(tenant, tick)]), within=90)
            # Pacing the load generator, not waiting for an outcome.
            time.sleep(max(0.0, start + (tick + 1) * 0.5 - time.monotonic()))
        failover.join(timeout=120)
        assert not failover.is_alive(), "the failover did not finish"

        wait_for(settled(client, ids), within=120, what="every accepted job sent or dead", interval=0.5)
        stop_cleanly(daemons)
        states = {i: client.status(i) for i in ids}

    dead = {i: s.last_error for i, s in states.items() if s.state == "dead"}
    assert all(dead.values()), f"dead without a reason: {dead}"
    delivered = collections.Counter(m.job_id for m in ses.sent)
    assert set(delivered) == {i for i in ids if i not in dead}, "lost or unknown mail"
    assert max(delivered.values()) == 1, "a mail was delivered twice"
    assert ses.max_in_window(1.0) <= GLOBAL_LIMIT
    by_tenant = ses.max_in_window_by(1.0, key=lambda m: m.tag("fairpost-tenant"))
    assert max(by_tenant.values()) <= TENANT_LIMIT, by_tenant
    back = min(m.monotonic for m in ses.sent if m.monotonic > killed_at) - killed_at
    assert back <= MAX_OUTAGE, f"sending again {back:.1f}s after the kill"
    print(f"{topology.kind}: first mail at SES {back:.1f}s after the master was killed; {len(ids)} jobs")
