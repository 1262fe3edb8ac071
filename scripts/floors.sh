#!/usr/bin/env bash
# The dependency floors, tested: every direct dependency of fairpost and of its
# daemon, console and otel extras at the lowest version pyproject.toml allows
# (uv's --resolution lowest-direct), in a virtualenv of its own (.venv-floors),
# then the SDK's tests, the daemon end to end (a real `fairpost run` process,
# SIGTERM and all), the webhook poster (aiohttp), the console's command line and
# the daemon's traces (OpenTelemetry) on it. `make test` runs it (make floors).
#
#   scripts/floors.sh [PYTEST ARGS]
#
# The test tools (pytest and its plugins, moto, hypothesis, standardwebhooks, and
# playwright, which the console tests' conftest imports) are
# not fairpost's dependencies: they are pinned to the versions .venv has, so only
# fairpost's own floors move. The virtualenv is built again only when
# pyproject.toml or this script changes (a stamp holds their hash): a second run
# costs the tests alone. Needs .venv (scripts/bootstrap.sh test), which has uv.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
venv="$repo_root/.venv-floors"
uv="$repo_root/.venv/bin/uv"
say() { printf 'floors: %s\n' "$*"; }

[[ -x "$uv" ]] || { echo "floors: $uv is missing: run scripts/bootstrap.sh test first" >&2; exit 1; }

wanted="$(cat pyproject.toml scripts/floors.sh | sha256sum | cut -d' ' -f1)"
stamp="$venv/.floors-installed"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]]; then
    say "$venv is up to date"
else
    # From scratch: uv keeps an installed version that satisfies a requirement,
    # and a floor raised since would not move an older install down to it.
    rm -rf "$venv"
    "$uv" venv --quiet --python "$repo_root/.venv/bin/python" "$venv"
    tools="$("$repo_root/.venv/bin/python" -c 'import importlib.metadata as m
print(" ".join(f"{n}=={m.version(n)}" for n in
    ("pytest", "pytest-asyncio", "pytest-timeout", "pytest-xdist", "hypothesis", "moto", "standardwebhooks",
     "playwright")))')"
    say "installing fairpost[daemon,console,otel] at its floors, with $tools"
    # shellcheck disable=SC2086  # one word a requirement
    VIRTUAL_ENV="$venv" "$uv" pip install --quiet --resolution lowest-direct \
        -e ".[daemon,console,otel]" $tools "moto[server]"
    printf '%s\n' "$wanted" >"$stamp"
fi
VIRTUAL_ENV="$venv" "$uv" pip list --quiet 2>/dev/null \
    | grep -iE '^(redis|pydantic|pydantic-settings|email-validator|idna|aioboto3|aiohttp|boto3|hiredis|prometheus-client|rich|jinja2|opentelemetry-(api|sdk|exporter-otlp)) ' \
    | awk '{printf "%s==%s ", $1, $2} END {print ""}' | sed 's/^/floors: at /'

# PYTHONPATH would put another checkout first; the floors' own editable install is this one.
env -u PYTHONPATH "$venv/bin/python" -m pytest -p no:cacheprovider -q -n 2 \
    -m "not cluster and not sentinel and not localstack" \
    tests/sdk \
    tests/e2e/test_shutdown.py::test_sigterm_returns_the_dispatchers_claims_to_their_queues \
    tests/daemon/test_sender.py::test_a_tenant_over_quota_pauses_alone \
    tests/outcomes/test_webhooks.py \
    tests/console/test_console_cli.py \
    tests/tracing/test_daemon_spans.py \
    "$@"
