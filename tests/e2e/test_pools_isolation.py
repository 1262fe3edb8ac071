"""Neither pool's backlog slows the other (#43), from outside: one ``fairpost run`` of two
pools (tests/support/pools.py), one of them backlogged behind a small global window.

No wall-clock budget (the machine may be loaded): the claim is an order. The other pool's
tenant sends all its mail while the backlogged pool has sent only a small part of its
backlog, which it could not if it waited behind it, or took turns with it at its rate."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from fairpost.config import load_settings
from fairpost.config.pools import DEFAULT_POOL
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.sdk.directory import PoolDirectory
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for
from tests.support.daemon_process import daemon_process
from tests.support.pools import job_ids, send

pytestmark = pytest.mark.slow

BACKLOG = 1000
SLOW = "4/second"  # the backlogged pool's global window: 250 s to drain it
QUICK = 100  # the other pool's tenant's mail: 2 s at its own window of 50/second


@pytest.mark.parametrize("backlogged", ["eu", DEFAULT_POOL])
def test_a_pool_s_backlog_does_not_hold_up_the_other_pool_s_mail(
    backlogged: str,
    pools_env: dict[str, str],
    tmp_path: Path,
    ses: SesServer,
    eu_ses: SesServer,
    redis_client: redis.Redis,
) -> None:
    other = DEFAULT_POOL if backlogged == "eu" else "eu"
    limits = {"eu": "FAIRPOST_POOLS__EU__GLOBAL_LIMITS", DEFAULT_POOL: "FAIRPOST_GLOBAL_LIMITS"}
    env = {**pools_env, limits[backlogged]: SLOW, limits[other]: "50/second"}
    slow_ses, quick_ses = (eu_ses, ses) if backlogged == "eu" else (ses, eu_ses)
    settings = load_settings()
    directory = PoolDirectory(settings, redis_client)
    directory.place("bulk", backlogged)
    directory.place("quick", other)
    with MailClient(settings) as client:
        bulk = send(client, "bulk", BACKLOG)
        with daemon_process(env, tmp_path, replica="r1"):
            slow_ses.wait_for(1, timeout=30)  # the backlogged pool is draining
            quick = send(client, "quick", QUICK)
            quick_ses.wait_for(QUICK, timeout=60)
            first, last = min(m.monotonic for m in quick_ses.sent), max(m.monotonic for m in quick_ses.sent)
            bulk_by_then = sum(1 for m in slow_ses.sent if m.monotonic <= last)
            bulk_meanwhile = sum(1 for m in slow_ses.sent if first <= m.monotonic <= last)
            # ... and the backlogged pool goes on at its own window meanwhile.
            wait_for(lambda: slow_ses.sent_count > bulk_by_then, within=30, what=f"{backlogged} to go on")
    assert sorted(job_ids(quick_ses.sent)) == sorted(quick)  # each once, and only the quick tenant's
    assert set(job_ids(slow_ses.sent)) <= set(bulk)
    # Most of the backlog still waited when the other pool's last mail went out ...
    assert bulk_by_then < BACKLOG // 4, f"{bulk_by_then} of {BACKLOG} sent before the other pool's {QUICK}"
    # ... and while the other pool sent its mail, the backlogged one sent far less: no turns
    # taken at one window (that would send about as many of each), no wait behind it.
    assert bulk_meanwhile < QUICK // 2, f"{bulk_meanwhile} of the backlog sent among the other pool's {QUICK}"
