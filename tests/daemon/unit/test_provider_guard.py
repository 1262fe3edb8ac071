"""The per-provider guard's decision (mailer/quota/provider_guard.py), which is pure:
which providers a tenant is held for, given its counts at each over the window."""

from __future__ import annotations

from fairpost.config import Settings, load_settings
from fairpost.mailer.quota.provider_guard import ProviderWindow, judge_providers, windows_since


def settings(**reputation: object) -> Settings:
    return load_settings(
        redis_url="redis://unused",
        reputation={"per_provider": True, "provider_min_sends": 20, **reputation},
    )


def test_bounces_at_one_provider_hold_that_provider_only() -> None:
    held = judge_providers(
        {"gmail": ProviderWindow(20, 4, 0), "outlook": ProviderWindow(20, 0, 0)}, settings()
    )
    assert list(held) == ["gmail"]
    why, bounce_rate, _ = held["gmail"]
    assert bounce_rate == 0.2
    assert why == "bounce rate 20.00% at gmail (4 of 20 sends) >= 4.00%"


def test_few_sends_count_as_the_minimum() -> None:
    # One bounce of two sends is 50 %, but counted over 20 sends it is 5 %: held;
    # with a minimum of 100 it is 1 %: not.
    assert list(judge_providers({"gmail": ProviderWindow(2, 1, 0)}, settings())) == ["gmail"]
    assert judge_providers({"gmail": ProviderWindow(2, 1, 0)}, settings(provider_min_sends=100)) == {}
    why, _, _ = judge_providers({"gmail": ProviderWindow(2, 1, 0)}, settings())["gmail"]
    assert "(1 of 2 sends, counted as 20)" in why


def test_just_under_the_threshold_is_not_held() -> None:
    assert judge_providers({"yahoo": ProviderWindow(100, 3, 0)}, settings()) == {}
    assert list(judge_providers({"yahoo": ProviderWindow(100, 4, 0)}, settings())) == ["yahoo"]


def test_complaints_hold_where_the_provider_reports_them() -> None:
    s = settings(complaint_threshold=0.01)
    held = judge_providers({"outlook": ProviderWindow(100, 0, 1), "gmail": ProviderWindow(100, 0, 5)}, s)
    # Gmail sends no complaint reports: whatever is counted there is not judged.
    assert list(held) == ["outlook"]
    assert held["outlook"][0].startswith("complaint rate 1.00% at outlook")


def test_other_is_never_held() -> None:
    assert judge_providers({"other": ProviderWindow(20, 20, 0)}, settings()) == {}


def test_after_a_lift_only_what_came_since_is_counted() -> None:
    base = {"100": {"gmail": [20, 4, 0]}}
    now = {"100": {"gmail": [25, 5, 0]}, "101": {"gmail": [10, 0, 0], "outlook": [3, 0, 0]}}
    windows = windows_since(now, base)
    assert windows == {"gmail": ProviderWindow(15, 1, 0), "outlook": ProviderWindow(3, 0, 0)}
    assert list(judge_providers(windows, settings())) == ["gmail"]  # 1 of 15, counted as 20: 5 %
    assert judge_providers(windows, settings(provider_min_sends=40)) == {}
