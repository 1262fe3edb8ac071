"""Plans per tenant, live: the admin class and ``fairpost tenant warmup``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from fairpost.config import Settings, load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.errors import InvalidOverride
from fairpost.mailer.quota.warmup_admin import WarmupAdmin
from tests.warmup.support import KEYS

PLAN = "50/hour; 500/day from 0s | 200/hour from 1 day | none from 7 days"


@pytest.fixture
def admin(settings: Settings) -> Iterator[WarmupAdmin]:
    with WarmupAdmin(settings) as warmup_admin:
        yield warmup_admin


def test_set_restart_and_skip_a_tenants_plan(admin: WarmupAdmin, redis_client: redis.Redis) -> None:
    place = admin.set_plan("acme", PLAN)
    assert (place.plan, place.source, place.step, place.held) == (PLAN, "operator", 0, None)
    assert place.started_ms == place.entered_ms and abs(place.started_ms - admin.now_ms()) < 5_000
    [view] = admin.show("acme")
    assert view.to_json()["next"] == {
        "step": 2,
        "limits": "200/hour",
        "due_ms": place.started_ms + 86_400_000,
    }
    # A place moved on (as a sender would write it) starts over at its first step.
    redis_client.hset(KEYS.warmup(), "acme", place.__class__(**{**place.__dict__, "step": 1}).to_json_text())
    again = admin.restart("acme")
    assert (again.step, again.plan) == (0, PLAN) and again.started_ms >= place.started_ms
    assert redis_client.sismember(KEYS.warmup_known(), "acme")
    assert admin.skip("acme") is True
    assert admin.skip("acme") is False
    assert admin.show() == [] and admin.show("acme") == []
    assert redis_client.sismember(KEYS.warmup_known(), "acme")  # a default plan never starts for it


def test_bad_input_is_refused_naming_the_field_and_the_rule(admin: WarmupAdmin) -> None:
    with pytest.raises(InvalidOverride) as caught:
        admin.set_plan("acme", "50/hour from 1 day")
    assert (
        caught.value.field == "plan" and "step 1" in caught.value.rule and "starts at 0s" in caught.value.rule
    )
    with pytest.raises(InvalidOverride) as caught:
        admin.set_plan("bad tenant!", PLAN)
    assert caught.value.field == "tenant"
    with pytest.raises(InvalidOverride) as caught:
        admin.restart("nobody")
    assert caught.value.field == "tenant" and "not warming up" in caught.value.rule
    with pytest.raises(InvalidOverride) as caught:
        admin.use_default("acme")
    assert caught.value.field == "plan" and "FAIRPOST_WARMUP__PLAN is empty" in caught.value.rule
    assert admin.show() == []


def test_the_default_plan_can_be_given_to_a_tenant(redis_url: str) -> None:
    settings = load_settings(redis_url=redis_url, warmup={"plan": "5/second from 0s | none from 1 day"})
    with WarmupAdmin(settings) as admin:
        place = admin.use_default("acme")
    assert (place.plan, place.source) == ("5/second from 0s | none from 1 day", "default")


def test_the_command_sets_shows_restarts_and_skips(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", settings.redis_url)
    assert main(["tenant", "warmup", "acme", "--plan", PLAN]) == 0
    out = capsys.readouterr().out
    assert "tenant acme: warm-up step 1 of 3 (50/hour; 500/day); next: 200/hour in 1d 0h" in out
    assert f"plan (operator): {PLAN}" in out
    assert main(["tenant", "warmup", "acme", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["warmup"]
    assert (shown["step"], shown["steps"], shown["limits"], shown["source"]) == (
        1,
        3,
        "50/hour; 500/day",
        "operator",
    )
    assert main(["tenant", "warmup", "acme", "--restart"]) == 0
    assert "warm-up step 1 of 3" in capsys.readouterr().out
    assert main(["tenant", "warmup", "acme", "--skip"]) == 0
    assert capsys.readouterr().out == "tenant acme: warm-up ended\n"
    assert main(["tenant", "warmup", "acme"]) == 0
    assert "not warming up (its own limits apply)" in capsys.readouterr().out
    # Refused, saying why, with nothing written.
    assert main(["tenant", "warmup", "acme", "--plan", "50/hour from 0s | 9/hour from 2 fortnights"]) == 1
    err = capsys.readouterr().err
    assert "plan: step 2 ('9/hour from 2 fortnights'): unknown unit 'fortnights'" in err
    assert main(["tenant", "warmup", "acme", "--restart"]) == 1
    assert "acme is not warming up" in capsys.readouterr().err
    assert main(["tenant", "warmup", "acme", "--default"]) == 1
    assert "FAIRPOST_WARMUP__PLAN is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tenant", "warmup", "acme", "--skip", "--restart"])  # one at a time
    # pause and resume are still there beside it.
    assert main(["tenant", "pause", "acme"]) == 0
    assert "tenant acme: paused" in capsys.readouterr().out
