"""The SDK rides out replicas that do not confirm a write (FAIRPOST_REDIS_MIN_REPLICAS).

A send waits for replicas to hold its job (``WAIT``); when too few confirm in
time it fails as ``NotReplicated``. A replica that restarts or falls behind is
an outage like a master's: the send is tried again for up to
FAIRPOST_REDIS_RETRY_SECONDS. A real master and a real replica, the replica
stopped (SIGSTOP: it stays connected and acknowledges nothing) and let go on.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fairpost import MailClient, RedisFailed
from fairpost.dispatcher.durable import Durability, NotReplicated
from fairpost.mailer.testing.wait import wait_for
from tests.sdk.test_sdk_retries import KEYS, MAIL, RIDES_OUT, jobs_written, settings_for, through_outage
from tests.support.topologies import Node, _data_node, _replica_online


def _server(tmp_path: Path, name: str, *extra: str) -> Node:
    node = _data_node(tmp_path, name, *extra)
    node.start()
    wait_for(node.answers, within=10, what=f"{name} to answer")
    return node


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    """A master and its replica, the replica done with its first sync."""
    main = _server(tmp_path, "master")
    replica = _server(tmp_path, "replica", "--replicaof", "127.0.0.1", str(main.port))
    try:
        with main.client() as admin:
            wait_for(lambda: _replica_online(admin.info("replication")), within=20, what="the replica")
        yield main, replica
    finally:
        resume(replica)
        replica.stop()
        main.stop()


def pause(node: Node) -> None:
    assert node.process is not None
    os.kill(node.process.pid, signal.SIGSTOP)


def resume(node: Node) -> None:
    if node.process is not None and node.running:
        os.kill(node.process.pid, signal.SIGCONT)


def replicated(node: Node, **overrides: Any) -> Any:
    """Settings whose sends wait for one replica, a short while."""
    return settings_for(node, redis_min_replicas=1, redis_wait_seconds=0.2, **overrides)


def test_a_send_while_the_replica_does_not_confirm_returns_once_it_does(
    master: tuple[Node, Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fairpost.sdk")
    main, replica = master
    with MailClient(replicated(main, redis_retry_seconds=RIDES_OUT)) as client:
        client.send("warmup", **MAIL)
        pause(replica)
        job_id = through_outage(lambda: client.send("acme", **MAIL), caplog, lambda: resume(replica))
    # The warm-up's job and this one, each once.
    assert jobs_written(main) == (2, 1, 2)
    # Handed back only once the replica holds it.
    with replica.client(decode_responses=True) as r:
        assert r.hget(KEYS.job(job_id), "state") == "queued"


def test_a_send_repeated_on_another_connection_is_not_confirmed_before_the_replica_holds_it(
    master: tuple[Node, Node],
) -> None:
    """``WAIT`` counts its own connection's writes only. A send repeated with the same
    idempotency key finds its job written and writes nothing: its ``WAIT``, on a
    connection whose writes the replica held long ago, would confirm at once, and
    the job id would go back while only the master holds the job (a failover then
    loses a mail the application was told is queued)."""
    main, replica = master
    settings = replicated(main, redis_retry_seconds=0)
    mail = {**MAIL, "idempotency_key": "order-1"}
    # The replica holds a first write (riding out its first sync on a loaded machine).
    with MailClient(replicated(main, redis_retry_seconds=RIDES_OUT)) as warm:
        warm.send("warmup", **MAIL)
    pause(replica)
    with MailClient(settings) as first, pytest.raises(RedisFailed):
        first.send("acme", **mail)
    with MailClient(settings) as second, pytest.raises(RedisFailed):
        second.send("acme", **mail)
    resume(replica)
    # Once the replica is back, the same send returns (riding out its catch-up: on
    # a loaded machine it may take longer than one WAIT's 0.2 s).
    with MailClient(replicated(main, redis_retry_seconds=RIDES_OUT)) as third:
        job_id = third.send("acme", **mail)
    with replica.client(decode_responses=True) as r:
        assert r.hget(KEYS.job(job_id), "state") == "queued"


def test_a_durable_pipeline_confirms_the_masters_earlier_writes_whichever_connection_made_them(
    master: tuple[Node, Node],
) -> None:
    """A write that finds its work done (a grant replayed for its token, a finish of a
    job finished already) writes nothing; the call still acts on a write another
    connection made. Redis's ``WAIT`` covers it (on 7.0.15 a ``WAIT`` after another
    connection's write waits for that write too), which fairpost.dispatcher.durable
    relies on: pinned here, so that a Redis that counted the connection's own writes
    only would be found out."""
    main, replica = master
    durable = Durability(replicas=1, timeout_ms=200)
    with main.client() as other, main.client() as this:
        this.set("warm", "1")  # this connection's own last write, held by the replica
        assert this.execute_command("WAIT", 1, 2000) == 1
        pause(replica)
        other.set("grant", "1")  # what this call relies on, made on another connection
        with this.pipeline(transaction=False) as pipe:
            pipe.get("grant")
            durable.queue_wait(pipe)
            with pytest.raises(NotReplicated):
                durable.check(pipe.execute())
        resume(replica)
        with this.pipeline(transaction=False) as pipe:
            pipe.get("grant")
            durable.queue_wait(pipe)
            assert durable.check(pipe.execute()) == [b"1"]
