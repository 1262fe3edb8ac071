"""Settings: defaults, ``FAIRPOST_*`` variables, the TOML file, and ``check-config``.

Every bad value must fail with a :class:`ConfigError` that names the variable
an operator has to fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairpost.config import (
    ConfigError,
    Settings,
    Window,
    format_limits,
    load_settings,
    mask_url,
    parse_limits,
)
from fairpost.mailer.cli import main

SECRET = "s3cr3t-Pa55word"
FORMAT_HINT = "COUNT/UNIT"


def problem_names(error: ConfigError) -> list[str]:
    return [name for name, _ in error.problems]


def config_error(**overrides: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings(**overrides)
    return info.value


def write_toml(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "fairpost.toml"
    path.write_text(text)
    monkeypatch.setenv("FAIRPOST_CONFIG_FILE", str(path))
    return path


# -- defaults ----------------------------------------------------------------


def test_defaults_load() -> None:
    settings = load_settings()
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.key_prefix == "fairpost"
    assert settings.queue_name == "fairpost-mail.fifo"
    assert settings.config_file is None
    assert settings.global_limits == (Window(seconds=1, limit=14), Window(seconds=86400, limit=50_000))
    assert settings.tenant_limits == (Window(seconds=1, limit=5), Window(seconds=86400, limit=10_000))
    assert settings.tenants == {}
    assert settings.dispatcher.concurrency == 100
    assert settings.sender.wait_seconds == 20
    assert settings.limits_for("anyone") == settings.tenant_limits
    assert settings.weight_for("anyone") == 1
    assert settings.inflight_cap_for("anyone") == 20


def test_settings_are_frozen() -> None:
    settings = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.inflight_cap = 3  # type: ignore[misc]


# -- limits ------------------------------------------------------------------


def test_global_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "14/second; 50000/day")
    settings = load_settings()
    assert settings.global_limits == (Window(seconds=1, limit=14), Window(seconds=86400, limit=50_000))
    assert format_limits(settings.global_limits) == "14/second; 50000/day"


@pytest.mark.parametrize(
    ("text", "windows"),
    [
        ("50000/day, 14/second", ((1, 14), (86400, 50_000))),
        ("100 per 2 minutes", ((120, 100),)),
        ("5/10 seconds", ((10, 5),)),
        ("  3 / Hour ;  ", ((3600, 3),)),
        ("1/7 days", ((7 * 86400, 1),)),
    ],
)
def test_limit_forms(text: str, windows: tuple[tuple[int, int], ...]) -> None:
    parsed = parse_limits(text)
    assert [(w.seconds, w.limit) for w in parsed] == list(windows)
    assert parse_limits(format_limits(parsed)) == parsed


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("14/sec", FORMAT_HINT),
        ("0/second", "at least 1"),
        ("abc", FORMAT_HINT),
        ("", "at least one limit"),
        (" ; ", "at least one limit"),
        ("5/second; 6/second", "same window"),
        ("5/second; 300/minute; 6/1 second", "same window"),
        ("1/8 days", "at most 7 days"),
        ("-1/second", FORMAT_HINT),
        ("1.5/second", FORMAT_HINT),
    ],
)
@pytest.mark.parametrize("variable", ["FAIRPOST_GLOBAL_LIMITS", "FAIRPOST_TENANT_LIMITS"])
def test_bad_limits_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str, rule: str
) -> None:
    monkeypatch.setenv(variable, text)
    error = config_error()
    assert problem_names(error) == [variable]
    assert rule in error.problems[0][1]
    assert variable in str(error)


# -- other variables ---------------------------------------------------------


def test_nested_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_DISPATCHER__CONCURRENCY", "7")
    monkeypatch.setenv("FAIRPOST_SENDER__RECEIVERS", "3")
    settings = load_settings()
    assert settings.dispatcher.concurrency == 7
    assert settings.sender.receivers == 3
    assert settings.dispatcher.batch_size == 50  # the rest of the section keeps its defaults


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FAIRPOST_DISPATCHER__CONCURRENCY", "0"),
        ("FAIRPOST_DISPATCHER__CONCURRENCY", "many"),
        ("FAIRPOST_SENDER__WAIT_SECONDS", "21"),
        ("FAIRPOST_SENDER__VISIBILITY_TIMEOUT", "43201"),
        ("FAIRPOST_INFLIGHT_CAP", "0"),
        ("FAIRPOST_MAX_MESSAGE_BYTES", "100"),
        ("FAIRPOST_KEY_PREFIX", "has space"),
        ("FAIRPOST_QUEUE_NAME", "not-fifo"),
        ("FAIRPOST_REDIS_URL", "http://localhost:6379"),
        ("FAIRPOST_LOG_LEVEL", "LOUD"),
        ("FAIRPOST_HTTP_PORT", "70000"),
    ],
)
def test_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    error = config_error()
    assert problem_names(error) == [variable]
    assert f"{variable}: " in str(error)


def test_every_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "abc")
    monkeypatch.setenv("FAIRPOST_INFLIGHT_CAP", "0")
    monkeypatch.setenv("FAIRPOST_DISPATCHER__CONCURRENCY", "0")
    error = config_error()
    assert sorted(problem_names(error)) == [
        "FAIRPOST_DISPATCHER__CONCURRENCY",
        "FAIRPOST_GLOBAL_LIMITS",
        "FAIRPOST_INFLIGHT_CAP",
    ]


@pytest.mark.parametrize("variable", ["FAIRPOST_TYPO", "FAIRPOST_GLOBAL_LIMIT", "FAIRPOST_DISPATCHER__TYPO"])
def test_unknown_variable_is_an_error(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "1")
    error = config_error()
    assert problem_names(error) == [variable]
    assert "not a fairpost setting" in error.problems[0][1]
    assert variable in str(error)


def test_overrides_are_validated_too() -> None:
    assert problem_names(config_error(inflight_cap=0)) == ["FAIRPOST_INFLIGHT_CAP"]
    assert load_settings(inflight_cap=3).inflight_cap == 3


# -- the TOML file -----------------------------------------------------------

ACME_TOML = """
[tenants.acme]
limits = "2/second; 100/day"
weight = 3
inflight_cap = 7
"""


def test_file_sets_tenant_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_toml(tmp_path, ACME_TOML, monkeypatch)
    settings = load_settings()
    assert settings.config_file == path
    assert settings.limits_for("acme") == (Window(seconds=1, limit=2), Window(seconds=86400, limit=100))
    assert settings.weight_for("acme") == 3
    assert settings.inflight_cap_for("acme") == 7
    # everybody else gets the defaults
    assert settings.limits_for("globex") == settings.tenant_limits == parse_limits("5/second; 10000/day")
    assert settings.weight_for("globex") == 1
    assert settings.inflight_cap_for("globex") == 20


def test_partial_tenant_override_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, '[tenants.acme]\nweight = 5\n\n[tenants."b.c-d_e"]\ninflight_cap = 2\n', monkeypatch)
    monkeypatch.setenv("FAIRPOST_DEFAULT_WEIGHT", "2")
    monkeypatch.setenv("FAIRPOST_TENANT_LIMITS", "9/minute")
    settings = load_settings()
    assert settings.weight_for("acme") == 5
    assert settings.limits_for("acme") == parse_limits("9/minute")
    # No cap of its own: the default, scaled by its weight against the default weight.
    assert settings.inflight_cap_for("acme") == 20 * 3
    assert settings.inflight_cap_for("other") == 20
    assert settings.weight_for("b.c-d_e") == 2
    assert settings.inflight_cap_for("b.c-d_e") == 2


def test_file_may_wrap_everything_in_a_fairpost_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_toml(
        tmp_path,
        '[fairpost]\nglobal_limits = "9/second"\n\n[fairpost.tenants.acme]\nweight = 4\n',
        monkeypatch,
    )
    settings = load_settings()
    assert settings.global_limits == (Window(seconds=1, limit=9),)
    assert settings.weight_for("acme") == 4


def test_environment_wins_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(
        tmp_path,
        'global_limits = "10/second"\ninflight_cap = 4\n\n[dispatcher]\nconcurrency = 5\nbatch_size = 3\n'
        + ACME_TOML,
        monkeypatch,
    )
    file_only = load_settings()
    assert file_only.global_limits == parse_limits("10/second")
    assert (file_only.inflight_cap, file_only.dispatcher.concurrency) == (4, 5)

    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "3/second")
    monkeypatch.setenv("FAIRPOST_DISPATCHER__CONCURRENCY", "6")
    monkeypatch.setenv("FAIRPOST_TENANTS__ACME__WEIGHT", "9")
    settings = load_settings()
    assert settings.global_limits == parse_limits("3/second")
    assert settings.dispatcher.concurrency == 6
    assert settings.weight_for("acme") == 9
    # what the environment does not set still comes from the file
    assert settings.inflight_cap == 4
    assert settings.dispatcher.batch_size == 3
    assert settings.limits_for("acme") == parse_limits("2/second; 100/day")
    assert settings.inflight_cap_for("acme") == 7


@pytest.mark.parametrize("tenant", ["bad id", "a/b", "a:b", "x" * 65, "tenänt"])
def test_invalid_tenant_id_in_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tenant: str) -> None:
    write_toml(tmp_path, f'[tenants."{tenant}"]\nweight = 2\n', monkeypatch)
    error = config_error()
    assert problem_names(error) == ["FAIRPOST_TENANTS"]
    assert repr(tenant) in error.problems[0][1]
    assert "1 to 64 characters" in error.problems[0][1]


@pytest.mark.parametrize(
    ("text", "variable"),
    [
        ("[tenants.acme]\nweight = 0\n", "FAIRPOST_TENANTS__ACME__WEIGHT"),
        ('[tenants.acme]\nlimits = "1/sec"\n', "FAIRPOST_TENANTS__ACME__LIMITS"),
        ("[tenants.acme]\ncolour = 1\n", "FAIRPOST_TENANTS__ACME__COLOUR"),
        ('gloabl_limits = "1/second"\n', "FAIRPOST_GLOABL_LIMITS"),
        ("inflight_cap = 0\n", "FAIRPOST_INFLIGHT_CAP"),
    ],
)
def test_bad_values_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, variable: str
) -> None:
    write_toml(tmp_path, text, monkeypatch)
    assert problem_names(config_error()) == [variable]


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("FAIRPOST_CONFIG_FILE", str(missing))
    error = config_error()
    assert problem_names(error) == ["FAIRPOST_CONFIG_FILE"]
    assert "does not exist" in error.problems[0][1]
    assert str(missing) in str(error)


@pytest.mark.parametrize("text", ["this is not toml", "[tenants.acme\nweight = 1\n", 'a = "unterminated'])
def test_invalid_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = write_toml(tmp_path, text, monkeypatch)
    error = config_error()
    assert problem_names(error) == ["FAIRPOST_CONFIG_FILE"]
    assert "not valid TOML" in error.problems[0][1]
    assert str(path) in str(error)


def test_fairpost_key_that_is_not_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, "fairpost = 3\n", monkeypatch)
    assert problem_names(config_error()) == ["FAIRPOST_CONFIG_FILE"]


# -- secrets -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (f"redis://user:{SECRET}@redis.internal:6380/2", "redis://user:***@redis.internal:6380/2"),
        (f"redis://:{SECRET}@redis.internal", "redis://:***@redis.internal"),
        (f"rediss://default:{SECRET}@[::1]:6379/0", "rediss://default:***@[::1]:6379/0"),
        (f"redis://redis.internal/0?password={SECRET}", "redis://redis.internal/0?password=***"),
        (
            f"redis://redis.internal/0?db=1&password={SECRET}&socket_timeout=2",
            "redis://redis.internal/0?db=1&password=***&socket_timeout=2",
        ),
        (f"unix://:{SECRET}@/run/redis.sock?db=3", "unix://:***@/run/redis.sock?db=3"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert load_settings(redis_url=url).redacted()["redis_url"] == masked


def test_redacted_never_shows_the_password() -> None:
    settings = load_settings(redis_url=f"redis://user:{SECRET}@redis.internal:6380/2")
    assert settings.redis_url.endswith(f"{SECRET}@redis.internal:6380/2")  # the real one is kept
    data = settings.redacted()
    assert SECRET not in json.dumps(data)
    assert data["redis_url"] == "redis://user:***@redis.internal:6380/2"
    assert data["global_limits"] == "14/second; 50000/day"
    assert data["dispatcher"]["concurrency"] == 100
    assert set(data) == set(Settings.model_fields)


# -- fairpost check-config ---------------------------------------------------


def test_check_config_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "14/sec")
    assert main(["check-config"]) == 1
    out, err = capsys.readouterr()
    assert "FAIRPOST_GLOBAL_LIMITS" in err
    assert "'14/sec' is not a limit" in err
    assert out == ""


def test_check_config_fails_on_an_unknown_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_TYPO", "1")
    assert main(["check-config", "--json"]) == 1
    assert "FAIRPOST_TYPO" in capsys.readouterr().err


def test_check_config_prints_masked_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", f"redis://user:{SECRET}@redis.internal:6380/2")
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "20/second")
    assert main(["check-config"]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert "redis://user:***@redis.internal:6380/2" in out
    assert '"20/second"' in out

    assert main(["check-config", "--json"]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    data = json.loads(out)
    assert data["redis_url"] == "redis://user:***@redis.internal:6380/2"
    assert data["global_limits"] == "20/second"


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("fairpost")
    assert script.exists(), f"{script} is not installed (pip install -e .)"
    # The autouse fixture already removed the developer's FAIRPOST_* variables.
    return subprocess.run(
        [str(script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_config_as_a_real_command() -> None:
    bad = run_cli("check-config", FAIRPOST_DISPATCHER__CONCURRENCY="0")
    assert bad.returncode == 1
    assert "FAIRPOST_DISPATCHER__CONCURRENCY" in bad.stderr

    good = run_cli("check-config", "--json", FAIRPOST_REDIS_URL=f"redis://:{SECRET}@redis.internal:6379/0")
    assert good.returncode == 0, good.stderr
    assert SECRET not in good.stdout + good.stderr
    assert json.loads(good.stdout)["redis_url"] == "redis://:***@redis.internal:6379/0"


# -- the Redis topology ------------------------------------------------------------


_SENTINELS, _MASTER = "FAIRPOST_REDIS_SENTINELS", "FAIRPOST_REDIS_SENTINEL_MASTER"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {"FAIRPOST_REDIS_CLUSTER": "true", "FAIRPOST_REDIS_SENTINELS": "s1:26379",
             "FAIRPOST_REDIS_SENTINEL_MASTER": "m"},
            ["FAIRPOST_REDIS_CLUSTER", "FAIRPOST_REDIS_SENTINELS"],
        ),
        ({_SENTINELS: "s1:26379"}, [_SENTINELS, _MASTER]),
        ({_MASTER: "m"}, [_SENTINELS, _MASTER]),
        ({"FAIRPOST_REDIS_SENTINEL_PASSWORD": "x"}, ["FAIRPOST_REDIS_SENTINEL_PASSWORD", _SENTINELS]),
        (
            {"FAIRPOST_REDIS_CLUSTER": "true", "FAIRPOST_REDIS_URL": "unix:///run/redis.sock"},
            ["FAIRPOST_REDIS_URL", "FAIRPOST_REDIS_CLUSTER"],
        ),
        (
            {"FAIRPOST_REDIS_CLUSTER": "true", "FAIRPOST_REDIS_URL": "redis://node-1:6379/3"},
            ["FAIRPOST_REDIS_URL", "FAIRPOST_REDIS_CLUSTER"],
        ),
        ({_SENTINELS: "s1", _MASTER: "m"}, [_SENTINELS]),
        ({"FAIRPOST_REDIS_MIN_REPLICAS": "-1"}, ["FAIRPOST_REDIS_MIN_REPLICAS"]),
        (
            {"FAIRPOST_REDIS_MIN_REPLICAS": "1", "FAIRPOST_REDIS_WAIT_SECONDS": "5"},
            ["FAIRPOST_REDIS_WAIT_SECONDS", "FAIRPOST_REDIS_TIMEOUT"],
        ),
    ],
)  # fmt: skip
def test_bad_redis_topology_names_every_variable_involved(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: list[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    [(names, rule)] = config_error().problems
    assert all(name in names for name in named), (names, rule)


def test_redis_topologies_load(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(
        redis_cluster=True, redis_url="rediss://:pw@cfg.cache.amazonaws.com:6379"
    ).redis_cluster
    monkeypatch.setenv("FAIRPOST_REDIS_SENTINELS", "s1:26379, [::1]:26380")
    monkeypatch.setenv("FAIRPOST_REDIS_SENTINEL_MASTER", "mymaster")
    monkeypatch.setenv("FAIRPOST_REDIS_SENTINEL_PASSWORD", SECRET)
    settings = load_settings()
    assert settings.sentinel_addresses() == [("s1", 26379), ("::1", 26380)]
    assert SECRET not in json.dumps(settings.redacted())
