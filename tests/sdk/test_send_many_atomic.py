"""send_many is all or nothing, also when Redis runs out of memory half-way."""

from __future__ import annotations

import contextlib

import redis

from fairpost import MailClient
from fairpost.config import load_settings
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import redis_server


def written(client: redis.Redis, keys: MailKeys) -> int:
    return sum(1 for _ in client.scan_iter(keys.job("*"))) - 1  # less the warm-up mail


def test_send_many_under_maxmemory_left_a_partial_batch() -> None:
    with redis_server() as server:
        url = server.url()
        settings = load_settings(redis_url=url)
        keys = MailKeys(settings.key_prefix)
        admin = redis.Redis.from_url(url)
        with MailClient(settings) as client, contextlib.closing(admin):
            client.send("acme", sender="app@example.com", to=["ada@example.org"], subject="warm", text="up")
            used = int(admin.info("memory")["used_memory"])
            # Room for the request (the six mails' 1.8 MB wait in Redis's input buffer)
            # but not for all of them stored too: one at a time, three would fit.
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", used + 1_000_000)
            mails = [
                {
                    "sender": "app@example.com",
                    "to": ["ada@example.org"],
                    "subject": f"m{i}",
                    "text": "x" * 300_000,
                }
                for i in range(6)
            ]
            error: Exception | None = None
            try:
                ids = client.send_many("acme", mails)
            except Exception as exc:
                error = exc
            count = written(admin, keys)
            assert count in (0, 6), f"send_many wrote {count} of 6 jobs ({error!r})"
            assert (error is None) == (count == 6), error
            if error is None:
                assert len(set(ids)) == 6
            # Over the limit now (or still): the next batch is refused whole.
            try:
                client.send_many("acme", mails[:3])
            except Exception as exc:
                error = exc
            else:
                error = None
            after = written(admin, keys)
            assert after in (count, count + 3), f"a second send_many wrote {after - count} of 3 jobs"
            admin.config_set("maxmemory", 0)
