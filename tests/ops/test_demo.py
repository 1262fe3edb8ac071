"""``fairpost demo``: the short scenario end to end, as a user runs it, plus its pure parts."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio
from redis.typing import EncodableT, FieldT
from rich.console import Console

from fairpost.config import Settings, Window
from fairpost.mailer.demo.backends import to_toml
from fairpost.mailer.demo.chart import rate_series
from fairpost.mailer.demo.load import schedule
from fairpost.mailer.demo.monitor import JobBook
from fairpost.mailer.demo.report import max_in_window, percentile
from fairpost.mailer.demo.scenario import builtin_names, load_scenario, parse_scenario
from fairpost.mailer.demo.view import LiveView, Phase
from fairpost.mailer.errors import DemoError
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.quota.engine import BUCKETS_PER_WINDOW, QuotaEngine
from fairpost.mailer.sdk.keys import MailKeys
from tests.support import KEYS

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smoke_scenario_end_to_end(tmp_path: Path) -> None:
    output = tmp_path / "out"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    fairpost = Path(sys.executable).with_name("fairpost")
    result = subprocess.run(
        [str(fairpost), "demo", "--scenario", "smoke", "--output", str(output)],
        cwd=tmp_path,
        env=_clean_env(scratch),
        capture_output=True,
        text=True,
        timeout=290,  # a hang-catcher: load, not the demo, decides how long it takes
    )
    assert result.returncode == 0, result.stdout + result.stderr

    summary = json.loads((output / "summary.json").read_text())
    scenario = load_scenario("smoke")
    assert summary["ok"] is True
    assert summary["interrupted"] is False
    assert set(summary["tenants"]) == set(scenario.tenants)
    for tenant, numbers in summary["tenants"].items():
        planned = scenario.planned(tenant)
        assert numbers["planned"] == planned > 0
        assert numbers["sent"] == planned, tenant
        assert numbers["recipients"] == planned * scenario.tenants[tenant].recipients
        assert numbers["waiting"] == numbers["dead"] == numbers["missing"] == 0
        assert numbers["windows"], tenant
        for peak in numbers["windows"]:
            assert peak["ok"] and 0 < peak["highest"] <= peak["allowed"], (tenant, peak)
        assert numbers["latency_p50_seconds"] <= numbers["latency_p99_seconds"]
    for peak in summary["global_windows"]:
        assert peak["ok"] and peak["highest"] <= peak["allowed"]
    assert summary["global_sent"] == scenario.total_planned()
    assert {c["name"]: c["ok"] for c in summary["checks"]} == {
        "never over quota": True,
        "nothing lost": True,
        "sent at most once": True,
    }

    chart = output / "rates.png"
    assert chart.read_bytes().startswith(PNG_SIGNATURE)
    assert chart.stat().st_size > 10_000
    assert summary["files"]["chart"] == str(chart)
    # Off a terminal the live table is replaced by plain progress lines.
    assert "[" in result.stdout and "load]" in result.stdout
    # Its temporary directory (Redis's files, the config, the logs) is gone.
    assert not list(scratch.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    fairpost = Path(sys.executable).with_name("fairpost")
    proc = subprocess.Popen(
        [str(fairpost), "demo", "--scenario", "default", "--output", str(tmp_path / "out")],
        cwd=tmp_path,
        env=_clean_env(scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[") and "load]" in line:
                break
        started = "".join(lines)
        pids = [int(p) for p in started.split("replicas running (pids ", 1)[1].split(")")[0].split(", ")]
        children = [int(p) for p in _children(proc.pid)]
        assert set(pids) <= set(children) and len(children) == len(pids) + 2  # + redis, moto
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, started + rest
    assert "interrupted" in rest
    for pid in children:
        assert not _alive(pid), f"process {pid} outlived the demo"
    assert not list(scratch.iterdir())


def _children(pid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return out.stdout.split()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _clean_env(scratch: Path) -> dict[str, str]:
    """The user's environment without fairpost or AWS endpoint settings: the demo starts its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FAIRPOST_", "AWS_ENDPOINT_URL")) and k not in ("AWS_PROFILE", "COLUMNS")
    }
    env["TMPDIR"] = str(scratch)
    return env


# -- the pure parts -------------------------------------------------------------------


def test_builtin_scenarios_load() -> None:
    assert {"default", "smoke", "crowd"} <= set(builtin_names())
    for name in builtin_names():
        scenario = load_scenario(name)
        assert scenario.total_planned() > 0
    default = load_scenario("default")
    assert default.planned("noisy") == 1500
    assert default.global_limits == (Window(1, 40),)
    assert default.limits_for("acme") == (Window(1, 8),)
    assert load_scenario("smoke").duration <= 10


def test_scenario_file_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'duration = 4\nglobal_limits = "10/second"\ntenant_limits = "2/second"\n'
        '[tenants.a]\nrate = 1.5\n[tenants.b]\nburst = 7\nburst_at = 1\nlimits = "3/second; 100/day"\n'
    )
    scenario = load_scenario(str(path))
    assert scenario.name == "mine"
    assert scenario.planned("a") == 6
    assert scenario.planned("b") == 7
    assert scenario.limits_for("b") == (Window(1, 3), Window(86400, 100))
    assert scenario.with_duration(2).planned("a") == 3

    with pytest.raises(DemoError, match="no scenario 'nope'"):
        load_scenario("nope")
    with pytest.raises(DemoError, match=r"tenants\.a\.rat"):
        parse_scenario('global_limits = "1/second"\ntenant_limits = "1/second"\n[tenants.a]\nrat = 1\n', "x")
    with pytest.raises(DemoError, match="tenant id"):
        parse_scenario('global_limits = "1/second"\ntenant_limits = "1/second"\n[tenants."a b"]\n', "x")
    with pytest.raises(DemoError, match="global_limits"):
        parse_scenario('global_limits = "lots"\ntenant_limits = "1/second"\n[tenants.a]\n', "x")


def test_schedule_spreads_trickles_and_keeps_bursts_whole() -> None:
    scenario = load_scenario("default")
    due = sorted(schedule(scenario))
    assert sum(d.count for d in due) == scenario.total_planned()
    bursts = [d for d in due if d.count > 1]
    assert [(b.tenant, b.count, b.at) for b in bursts] == [("noisy", 1500, 3.0)]
    acme = [d.at for d in due if d.tenant == "acme"]
    gaps = {round(b - a, 6) for a, b in itertools.pairwise(acme)}
    assert gaps == {0.5}
    assert all(0 <= d.at < scenario.duration for d in due)


def test_max_in_window_is_a_sliding_window() -> None:
    # (t - 1000, t]: events exactly 1000 ms apart are in different windows.
    assert max_in_window([(0, 1), (1000, 1)], 1000) == (1, 0)
    assert max_in_window([(0, 1), (999, 1)], 1000) == (2, 999)
    events = [(0, 3), (400, 3), (900, 2), (1100, 3), (1950, 1)]
    assert max_in_window(events, 1000) == (8, 900)
    assert max_in_window([], 1000) == (0, None)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([2.0], 99) == 2.0
    assert percentile([], 50) is None


def test_rate_series_never_draws_a_kept_quota_above_it() -> None:
    # 8 recipients at the start of every second: at the quota of 8/second.
    events = [(s + i * 0.01, 1) for s in range(10) for i in range(8)]
    xs, ys = rate_series(events, 10.0)
    assert (xs[0], xs[-1]) == (2.0, 8.0)
    assert max(ys) == 8.0


async def test_the_quota_state_the_demo_shows_is_the_engines(
    aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    # What the demo does each tick (Demo._with_replicas): collect_stats for the scenario's
    # tenants, under the settings the scenario implies, shown by its LiveView. Off a
    # terminal that is one plain line: each tenant's quota use and how long it waits.
    scenario = parse_scenario(
        'global_limits = "100/minute"\ntenant_limits = "8/minute"\n[tenants.acme]\nrate = 1\n'
        "[tenants.noisy]\nburst = 20\n",
        "shown",
    )
    settings = Settings(redis_url=redis_url, **scenario.config())
    keys = MailKeys(settings.key_prefix)
    engine = QuotaEngine(aredis, keys)
    for tenant, costs in (("acme", [1, 2]), ("noisy", [1] * 9)):
        await engine.acquire(tenant, costs, scenario.global_limits, scenario.limits_for(tenant))

    stats = await collect_stats(aredis, keys, settings, tenants=list(scenario.tenants))
    console = Console(record=True, force_terminal=False, width=500)
    LiveView(console, scenario, replicas=1).update(Phase("load", 0.0, 10.0), stats, JobBook())
    shown = dict(part.split(": ", 1) for part in console.export_text().strip().split(" | ")[1:])

    [(_, used_by_all)] = await engine.usage(None, scenario.global_limits, now_ms=stats.at_ms)
    assert shown.pop("all") == f"sent 0/{scenario.total_planned()}, {used_by_all}/100 per minute"
    assert set(shown) == set(scenario.tenants)
    shown_line = re.compile(r"backlog 0 in flight 0 sent 0 (\d+)/(\d+) per minute(?: paused \+([\d.]+)s)?")
    for tenant in scenario.tenants:
        windows = scenario.limits_for(tenant)
        # The engine asked at the moment the demo's numbers were read (Redis time).
        [(window, used)] = await engine.usage(tenant, windows, now_ms=stats.at_ms)
        wait = await engine.retry_after(tenant, windows, now_ms=stats.at_ms)
        match = shown_line.fullmatch(shown[tenant])
        assert match is not None, shown[tenant]
        assert (int(match[1]), int(match[2])) == (used, window.limit), (tenant, shown[tenant])
        # Shown to a tenth of a second; read a moment after stats.at_ms, never longer.
        shown_wait = float(match[3] or 0)
        assert (shown_wait > 0) == (wait > 0), (tenant, shown[tenant], wait)
        assert wait - 1.0 <= shown_wait <= wait + 0.05, (tenant, shown[tenant], wait)
    assert shown["acme"].endswith("3/8 per minute")  # fits: no wait shown
    assert shown["noisy"].startswith("backlog 0 in flight 0 sent 0 8/8 per minute paused +")


async def test_the_engine_counts_a_window_from_its_buckets(aredis: redis.asyncio.Redis) -> None:
    # Usage and the wait for one more unit at a window's edge, from the buckets as
    # stored: what collect_stats (and so the demo and `fairpost stats`) shows.
    engine, keys = QuotaEngine(aredis, KEYS), KEYS

    async def state(buckets: dict[int, int]) -> tuple[int, int]:
        """(units counted at 10,000 ms, the ms at which one more fits)."""
        await aredis.delete(keys.quota("t:acme", 1))
        # The buckets, and the running total, lowest and newest bucket every write keeps.
        fields: dict[FieldT, EncodableT] = {str(b): units for b, units in buckets.items()}
        fields.update(n=sum(buckets.values()), lo=min(buckets), hi=max(buckets))
        await aredis.hset(keys.quota("t:acme", 1), mapping=fields)
        [(_, count)] = await engine.usage("acme", [window], now_ms=10_000)
        wait = await engine.retry_after("acme", [window], now_ms=10_000)
        return count, 10_000 + round(wait * 1000)

    window = Window(1, 8)
    width = 1000 // BUCKETS_PER_WINDOW
    # At 10,000 ms the window (9000, 10000] starts in bucket 9001 // width.
    first = 9001 // width
    assert await state({first - 1: 5, first + 5: 3}) == (3, 10_000)
    # Full: the next unit fits once bucket first+5 has left, a window after its end.
    assert await state({first + 5: 3, first + 10: 5}) == (8, (first + 6) * width + 999)


def test_to_toml_round_trips() -> None:
    import tomllib

    data = {
        "redis_url": "redis://127.0.0.1:1/0",
        "inflight_cap": 8,
        "shutdown_grace": 3.0,
        "tenants": {"a": {}, "b": {"limits": "3/second", "weight": 2}},
        "sender": {"max_jitter_seconds": 0.05},
    }
    assert tomllib.loads(to_toml(data)) == data
