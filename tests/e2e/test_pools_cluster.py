"""Sending pools on a Redis Cluster (#43): each pool's keys in a slot of its own, on the shard
its hash tag falls on, and each pool's scripts run there, touching that slot only."""

from __future__ import annotations

import pytest

from fairpost.config import Settings, load_settings
from fairpost.config.pools import pool_names, pool_settings
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.store import JobStore, store_limits
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.sdk.keys import MailKeys
from tests.support.topologies import Cluster

# Hash tags whose slots fall on the three masters of a 3-master cluster's even split
# (docs/operations.md, "Sending pools": choose the prefixes so).
POOLS = {
    "apac": {"queue_name": "fairpost-apac.fifo", "region": "ap-southeast-2"},
    "us": {"queue_name": "fairpost-us.fifo", "region": "us-west-2"},
}


@pytest.fixture
def settings(cluster_srv: Cluster) -> Settings:
    cluster_srv.flush()
    return load_settings(redis_url=cluster_srv.url, redis_cluster=True, pools=POOLS)


async def test_each_pool_s_keys_sit_on_their_own_shard_and_its_scripts_run_there(
    settings: Settings, cluster_srv: Cluster
) -> None:
    tenants = {"default": "t-default", "apac": "t-apac", "us": "t-us"}
    with MailClient(settings) as client, client.pools() as pools:
        for pool, tenant in tenants.items():
            if pool != "default":
                pools.move(tenant, pool)  # a tenant with no mail yet: placed at once
        jobs = {pool: client.send(t, sender="a@example.com", to="b@example.org", subject="s", text="t")
                for pool, t in tenants.items()}  # fmt: skip
    shards = set()
    for pool in pool_names(settings):
        own = pool_settings(settings, pool)
        keys = MailKeys(own.key_prefix)
        aclient = async_redis_client(own)  # the master of the pool's slot
        try:
            queue = keys.queue(tenants[pool], "normal")
            node = cluster_srv.node_for(queue)
            shards.add(node.port)
            with node.client() as on_node:  # the key is on the master of its pool's slot
                assert on_node.exists(queue) == 1
            # The pool's dispatcher claims its own tenant's job there (claim.lua: one slot).
            claimed = await JobStore(aclient, keys, store_limits(own)).claim(10)
            assert [job.id for job in claimed] == [jobs[pool]]
        finally:
            await aclient.aclose()
    assert len(shards) == 3
