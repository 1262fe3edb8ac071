"""Streams through the whole pipeline (issue #42): a tenant's notification backlog
neither delays its transactional mail nor goes over the notification stream's own
limit, which counts in the tenant's quota as well; the limit is set and shown live."""

from __future__ import annotations

import pytest

from fairpost import AsyncMailClient
from fairpost.config import Settings
from fairpost.mailer.cli import main
from fairpost.mailer.quota.overrides import QuotaAdmin
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline
from tests.unsubscribe.support import unsubscribe_settings

pytestmark = pytest.mark.usefixtures("ses_env")


async def test_a_notification_backlog_waits_at_its_own_limit_and_never_in_front_of_transactional_mail(
    redis_url: str, ses: SesServer
) -> None:
    settings = unsubscribe_settings(
        redis_url, tenants={"acme": {"limits": "20/second", "notification_limits": "2/second"}}
    )
    async with pipeline(settings), AsyncMailClient(settings) as client:
        notes = [
            await client.send(
                "acme",
                sender="app@acme.example",
                to=f"n{i}@example.org",
                subject="n",
                text="n",
                stream="notification",
                topic="digest",
            )
            for i in range(10)
        ]
        await wait_for_async(lambda: ses.sent_count >= 1, within=20, what="the first notification")
        receipts = [
            await client.send(
                "acme", sender="app@acme.example", to=f"t{i}@example.org", subject="t", text="t"
            )
            for i in range(5)
        ]
        await wait_for_async(lambda: ses.sent_count >= 15, within=60, what="all fifteen mails")
    at = {m.job_id: m.monotonic for m in ses.sent}
    note_times = sorted(at[j] for j in notes)
    # The stream's limit binds: never more than 2 notifications in a second...
    assert ses.max_in_window_by(1.0, key=lambda m: m.job_id in notes)[True] <= 2
    # ...and the receipts, enqueued behind 9 waiting notifications, all went out before
    # the notifications' last (which its limit holds until 4 s after their first).
    assert max(at[j] for j in receipts) < note_times[-1], (sorted(at[j] for j in receipts), note_times)


def test_a_streams_limit_is_set_shown_and_reset_live(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", settings.redis_url)
    assert main(["quota", "show", "acme:notification"]) == 0
    assert "none of its own" in capsys.readouterr().out
    assert main(["quota", "set", "acme:notification", "3/second; 500/day"]) == 0
    assert main(["quota", "show", "acme:notification", "--json"]) == 0
    shown = capsys.readouterr().out
    assert '"limits": "3/second; 500/day"' in shown and '"source": "override"' in shown
    with QuotaAdmin(settings) as admin:
        assert [e.scope for e in admin.show()][1:] == ["acme:notification"]
        assert admin.reset_tenant_limits("acme:notification")
    assert main(["quota", "set", "acme:digest", "3/second"]) == 1
    assert "tenant" in capsys.readouterr().err
