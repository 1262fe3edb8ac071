"""``fairpost demo --scenario bounce``: one tenant's list bounces, the guard pauses it alone,
and its outcomes reach the demo's webhook receiver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairpost.mailer.demo.scenario import load_scenario
from tests.ops.test_demo import PNG_SIGNATURE, _clean_env
from tests.support.daemon_process import log_records


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bounce_scenario_pauses_the_bouncing_tenant_and_no_other(tmp_path: Path) -> None:
    output = tmp_path / "out"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    fairpost = Path(sys.executable).with_name("fairpost")
    result = subprocess.run(
        [str(fairpost), "demo", "--scenario", "bounce", "--duration", "30", "--output", str(output)],
        cwd=tmp_path,
        env=_clean_env(scratch),
        capture_output=True,
        text=True,
        timeout=290,  # a hang-catcher: the scenario runs 30 s, start-up as long as load makes it
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((output / "summary.json").read_text())
    scenario = load_scenario("bounce").with_duration(30)
    tenants = summary["tenants"]
    # Paused after its 8th bounce (4 % of 200): about 80 of its 600 mails went out.
    assert 60 <= tenants["bouncy"]["sent"] <= 100, tenants["bouncy"]
    assert tenants["bouncy"]["waiting"] == 600 - tenants["bouncy"]["sent"]
    for tenant in ("acme", "globex", "initech", "umbrella"):
        assert tenants[tenant]["sent"] == scenario.planned(tenant), tenant
    assert all(c["ok"] for c in summary["checks"]), summary["checks"]
    # Its outcomes reached the demo's receiver as webhooks, every one verified with
    # the Standard Webhooks library: a mail.sent per sent job, and SES's verdicts.
    assert "webhooks reach the application" in [c["name"] for c in summary["checks"]]
    hooks = summary["webhooks"]["bouncy"]
    assert hooks["unverified"] == 0, hooks
    events = hooks["events"]
    assert events["mail.sent"] == tenants["bouncy"]["sent"], hooks
    assert events["mail.bounced"] >= 1 and events["mail.delivered"] >= 1, hooks
    assert events["mail.bounced"] + events["mail.delivered"] <= events["mail.sent"], hooks
    assert "webhooks to bouncy's receiver" in result.stdout
    assert (output / "rates.png").read_bytes().startswith(PNG_SIGNATURE)
    # The guard acted on the bouncing tenant alone: the others were neither throttled
    # nor paused (their latency is no witness: on a loaded machine moto alone can
    # hold a mail for seconds).
    guarded = _guard_actions(output / "logs")
    assert {tenant for tenant, _ in guarded} == {"bouncy"}, guarded
    assert any(message.startswith("reputation guard paused the tenant") for _, message in guarded)


def _guard_actions(logs: Path) -> list[tuple[str, str]]:
    """(tenant, message) of every reputation guard log line the replicas wrote."""
    return [
        (str(record.get("tenant")), str(record["msg"]))
        for path in logs.iterdir()
        for record in log_records(path.read_text())
        if str(record.get("msg", "")).startswith("reputation guard")
    ]
