"""The pools' shard bench (bench/pool_shards.py, #43) cannot rot: it puts the pools on
different masters, and (tests/ops/test_bench.py, on the quick bench's run of it) its
tiny run on a real cluster reports both figures from drains whose keys sit where the
pools' hash tags say. Targets are not asserted (machines differ; BENCHMARKS.md has the
figures)."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from bench.cluster import BenchError
from bench.pool_shards import PREFIX, Drain, slot_of_prefix, spread_pools
from fairpost.mailer.sdk.keys import MailKeys


def thirds(slot: int) -> int:
    """The master of a slot as ``redis-cli --cluster create`` splits them over three."""
    return slot * 3 // 16384


def test_the_pools_it_names_have_their_hash_tags_on_three_masters() -> None:
    names = spread_pools(thirds)
    prefixes = [PREFIX, *(f"{PREFIX}:pool:{name}" for name in names)]
    assert len(names) == 2
    assert len({thirds(slot_of_prefix(p)) for p in prefixes}) == 3
    # The slot is the one every key of the pool hashes to.
    assert slot_of_prefix(prefixes[1]) == key_slot(MailKeys(prefixes[1]).job("x").encode())


def test_it_refuses_a_cluster_where_the_pools_cannot_spread() -> None:
    with pytest.raises(BenchError, match="3 masters"):
        spread_pools(lambda slot: slot % 2)


def test_the_figure_is_the_mails_over_the_busiest_masters_cpu() -> None:
    drain = Drain(3, 300, 1.0, {1: 0.1, 2: 0.15, 3: 0.12}, {1: 0.0, 2: 0.0, 3: 0.0}, {})
    assert drain.per_core == pytest.approx(2000)
    both = drain.plus(drain)
    assert both.mails == 600
    assert both.busy[2] == pytest.approx(0.3)
    assert both.per_core == pytest.approx(2000)
