"""The soak (bench/soak.py, #41) cannot rot: a tiny run from outside reports every
figure, and its verdict is growth over the memory model's prediction.

The ratio of a tiny run is not asserted: a few dozen mails cannot hide Redis's
tables doubling (BENCHMARKS.md has the 12-minute run's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import key_tables
from bench.soak import ROUNDING, Sample, Weighed, second_half, verdict

ROOT = Path(__file__).resolve().parents[2]

FIGURES = {
    "mails_sent",
    "used_memory_growth",
    "bytes_per_sent_mail",
    "keys_per_sent_mail",
    "waiting_at_start_and_end",
    "first_day_bytes_per_mail_by_term",
    "model_first_day_bytes_per_mail",
    "model_documented_first_day_bytes_per_mail",
    "constants_bytes",
    "constants_bytes_per_sent_mail",
    "prediction_per_sent_mail",
    "growth_over_prediction",
    "growth_over_documented",
    "allowed_ratio",
    "verdict",
    "beyond_memory_usage_per_sent_mail",
    "key_table_growth_per_sent_mail",
    "expiry_table_growth_per_sent_mail",
    "second_half_median_bytes_per_sent_mail",
    "second_half_median_over_first_day_terms",
}

TINY = (
    "--minutes",
    "0.08",
    "--rate",
    "5",
    "--tenants",
    "2",
    "--sample-seconds",
    "2",
    "--warmup-seconds",
    "2",
)
"""About 25 mails of two tenants: the run, start to stop, in under 20 s."""

LINES = (
    "mails sent:",
    "used_memory growth:",
    "bytes per sent mail:",
    "keys per sent mail:",
    "prediction per sent mail:",
    "growth / prediction:",
)


def test_the_prediction_is_the_first_day_terms_a_mail_the_constants_and_the_tables() -> None:
    # 2,000 keys more, each with a TTL: the key table and the expiry table each go
    # from 128 slots to 4,096 (a power of two at least the keys), and each key
    # costs its entries' bytes beyond MEMORY USAGE.
    begin = Sample(0.0, 1_000_000, 100, 50, 50, expires=100)
    end = Sample(60.0, 1_000_000 + 1_000_000, 2_100, 1_050, 1_050, expires=2_100)
    kinds = Weighed(
        {"job": 424_000, "hist": 90_000, "outcomes": 225_000, "sesmsg": 184_000, "rep": 2_000},
        {"job": 1_000, "hist": 10, "outcomes": 0, "sesmsg": 1_000, "rep": 1},
    )
    got = verdict(begin, end, kinds)
    tables = 2 * 8 * (4_096 - 128) + (8 + 32) * 2_000
    assert key_tables.growth((100, 2_100), (100, 2_100)) == tables
    assert got["mails_sent"] == 1_000
    assert got["model_first_day_bytes_per_mail"] == 923.0
    assert got["constants_bytes"] == {"rep": 2_000}
    assert got["key_tables_bytes_per_sent_mail"] == round(tables / 1_000, 1)
    assert got["prediction_per_sent_mail"] == pytest.approx(925.0 + tables / 1_000, abs=0.1)
    assert got["growth_over_prediction"] == pytest.approx(1_000_000 / (925_000 + tables), abs=1e-3)
    assert got["keys_per_sent_mail"] == 2.0
    assert got["verdict"] == "meets"
    # Growth past the model and the allocator's rounding: keys the model does not know of.
    assert 1_000_000 / (800_000 + tables) > 1 + ROUNDING
    assert verdict(begin, end, Weighed({"job": 800_000}))["verdict"] == "misses"


def test_the_tables_are_sized_as_redis_sizes_them() -> None:
    assert [key_tables.slots(n) for n in (0, 1, 4, 5, 65_536, 65_537)] == [0, 4, 4, 8, 65_536, 131_072]
    # A key without a TTL: the entry's rounding and 1.5 slots; with one, its expiry
    # entry and 1.5 slots more.
    assert key_tables.per_key(with_ttl=False) == 20.0
    assert key_tables.per_key(with_ttl=True) == 64.0


def test_the_second_half_is_its_median_interval_a_mail() -> None:
    # Six intervals of 100 mails: the first half's not counted, the second half's
    # 1,000, 3,000 (Redis's tables doubled), 1,100 bytes a mail.
    used = [0, 500_000, 600_000, 700_000, 800_000, 1_100_000, 1_210_000]
    samples = [Sample(10.0 * i, u, 0, 100 * i, 100 * i) for i, u in enumerate(used)]
    got = second_half(samples, 1_000.0)
    assert got["second_half_intervals"] == 3
    assert got["second_half_median_bytes_per_sent_mail"] == 1_100.0
    assert got["second_half_median_over_first_day_terms"] == 1.1
    assert second_half([], 1_000.0)["second_half_median_bytes_per_sent_mail"] is None


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tiny_soak_from_outside_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak", *TINY, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    data = json.loads(out.read_text())
    assert set(data) >= FIGURES
    assert data["mails_sent"] > 0
    assert data["waiting_at_start_and_end"] == [0, 0]
    assert data["daemon_errors"] == 0
    # Every mail keeps a record and an SES message id's index; the feed and the
    # history hold each a share of a key.
    terms = data["first_day_bytes_per_mail_by_term"]
    assert all(terms[k] > 0 for k in ("job", "hist", "outcomes", "sesmsg"))
    assert data["keys_by_kind"]["job"] == data["keys_by_kind"]["sesmsg"] == data["mails_sent"]
    assert data["samples"], "no sample taken"
    # Each record and index has a TTL: the expiry table grows by an entry for each.
    assert data["expiry_table_growth_per_sent_mail"] > 0
    assert data["verdict"] in {"meets", "misses"}
    for line in LINES:
        assert line in result.stdout, line
