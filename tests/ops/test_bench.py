"""The benchmark suite cannot rot: its tiny version runs end to end and reports every figure.

Targets are not asserted here (machines differ); only that ``python -m bench
--quick`` exits 0 (no safety figure failed, every scenario ran) and writes the
JSON with every figure the full run writes: in three runs of a few scenarios each
(``--only``), which between them run every scenario once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCENARIO_FIGURES: dict[str, set[str]] = {
    "quota_engine": {"quota_engine_speedup"},
    "safety": {
        "safety_global_window",
        "safety_tenant_window",
        "safety_global_window_slow_ses",
        "safety_tenant_window_slow_ses",
        "safety_sqs_requests_per_mail",
        "safety_lost",
        "safety_duplicates",
    },
    "isolation": {"isolation_p99_ratio", "utilisation", "receives_per_throttled_mail"},
    "fairshare": {
        "fair_share_deviation",
        "global_utilisation",
        "global_share_deviation",
        "global_finish_spread",
    },
    "throughput": {"sqs_requests_per_mail", "cpu_per_mail_ratio", "scaling_1", "scaling_2", "scaling_4"},
    "strategies": {"strategy_sleep", "strategy_put_back", "strategy_fairpost"},
    "scale": {
        *(f"scale_op_{op}" for op in ("enqueue", "claim", "handoff", "finish", "cancel", "requeue", "reap")),
        *(f"scale_op_{op}" for op in ("promote", "stats_tenant", "acquire")),
        *(f"scale_op_{op}_random" for op in ("enqueue", "claim", "handoff", "finish", "cancel", "requeue")),
        *(f"scale_op_{op}_random" for op in ("reap", "promote", "stats_tenant", "acquire")),
        "scale_idle_cpu_ratio",
        "scale_light_latency_ratio",
        "scale_enqueue_rate_ratio",
        "scale_drain_rate_ratio",
        "scale_memory_per_job",
        "scale_redis_cpu_per_mail",
        "scale_shard_cpu_per_mail",
        "scale_mails_per_shard",
        "scale_mail_in_sets",
        "scale_sqs_inflight_per_throttled_tenant",
    },
    "tracing": {
        "tracing_off_cpu_ratio",
        "tracing_off_redis_ratio",
        "tracing_on_cpu_ratio",
        "tracing_on_redis_ratio",
    },
    "outcomes": {"outcome_redis_cpu_ratio", "outcome_event_redis_usec", "webhook_deliveries_per_second"},
    "streams": {"streams_transactional_p99_ratio", "streams_notification_window"},
    "pools": {"pools_shard_speedup", "pools_routing_cost"},
    "finished_memory": {"finished_mail_memory"},
}
"""The figures each scenario (``python -m bench --only NAME``) reports."""

FIGURES = set().union(*SCENARIO_FIGURES.values())
"""Every figure the full run writes."""

RUNS = {
    "scale-tracing-isolation-quota": ("scale", "tracing", "isolation", "quota_engine"),
    "outcomes-pools-safety": ("outcomes", "pools", "safety"),
    "strategies-throughput-fairshare-streams-memory": (
        "strategies",
        "throughput",
        "fairshare",
        "streams",
        "finished_memory",
    ),
}
"""The quick bench in three runs of about a minute and a half each (their scenarios
took 75 to 80 s alone on a 2-core machine, 2026-11-29) rather than one of four:
pytest-xdist's workers share them, and no run is left to keep one worker busy minutes
after the other has finished. A scenario added to bench/cli.py joins one of them
(test_the_runs_cover_every_scenario_once fails until it does)."""


def test_the_runs_cover_every_scenario_once() -> None:
    from bench.cli import SCENARIOS

    named = [name for run in RUNS.values() for name in run]
    assert sorted(named) == sorted(SCENARIOS) == sorted(SCENARIO_FIGURES)


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(1000)
@pytest.mark.parametrize("scenarios", list(RUNS.values()), ids=list(RUNS))
def test_quick_bench_runs_and_reports_every_figure(scenarios: tuple[str, ...], tmp_path: Path) -> None:
    # What is tested is that every figure is taken and reported, not how fast: the
    # whole quick bench took about 3 minutes on an idle 2-core machine and 7.5 with
    # other tests beside it (2026-11-26). The limit only catches a hang.
    out, table = tmp_path / "bench.json", tmp_path / "bench.md"
    only = [arg for name in scenarios for arg in ("--only", name)]
    # Both files in tmp_path: a test must not overwrite the developer's bench/results.
    command = [sys.executable, "-m", "bench", "--quick", *only, "--json", str(out), "--markdown", str(table)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=960, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    data = json.loads(out.read_text())
    expected = set().union(*(SCENARIO_FIGURES[name] for name in scenarios))
    assert set(data["figures"]) == expected
    for key, figure in data["figures"].items():
        assert "value" in figure and "verdict" in figure, key
        assert figure["verdict"] in {"meets", "misses", "reported"}, (key, figure["verdict"])
    assert data["quick"] is True
    assert data["errors"] == []
    assert table.read_text().count("\n") > len(expected)
    assert data["machine"]["cores"] >= 1
    assert "figure" in result.stdout and "python -m bench --quick" in result.stdout
    if "pools" in scenarios:
        pools_on_their_shards(data["figures"])


def pools_on_their_shards(figures: dict[str, Any]) -> None:
    """The pools' shard bench (bench/pool_shards.py, #43) drained on a real cluster: the
    pools on three masters, one pool's keys on one master, three pools' on all three.
    Checked on the quick run's figures: a run of its own started one more cluster and
    drained the same way (tests/ops/test_pool_shards.py tests its pure parts)."""
    speedup, routing = figures["pools_shard_speedup"], figures["pools_routing_cost"]
    assert speedup["value"] is not None and speedup["value"] > 0
    assert routing["value"] is not None
    assert len(set(speedup["data"]["placed"].values())) == 3
    one, three = speedup["data"]["one"], speedup["data"]["three"]
    assert sorted(n > 0 for n in one["keys"].values()) == [False, False, True]
    assert all(n > 0 for n in three["keys"].values())
    # The quick run drains 200 mails a pool (bench/pool_shards.py's run).
    assert (one["mails"], three["mails"]) == (200, 600)
