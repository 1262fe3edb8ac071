#!/usr/bin/env bash
# Set up everything fairpost's make targets need, from a fresh machine.
#
#   scripts/bootstrap.sh [EXTRAS]      # EXTRAS: test (default), demo, daemon, "demo,test", ...
#
# Idempotent; a second run with nothing changed takes well under a second:
#   1. redis-server on PATH: installed from Debian's packages when missing and
#      running as root with apt-get; otherwise stops and says what to install.
#   2. .venv with Python >= 3.11 (python3.11, else python3; FAIRPOST_PYTHON
#      overrides), recreated if it is missing or broken.
#   3. pip install -e ".[EXTRAS]", skipped when pyproject.toml has not changed
#      since the last successful install with these extras (a stamp file in
#      .venv holds pyproject's hash).
#   4. With the test extra only: LocalStack's pinned virtualenv, through
#      scripts/install-localstack.sh when that script exists.
#   5. With FAIRPOST_BOOTSTRAP_STRESS=1 (make test-stress): stress-ng, from
#      Debian's packages like redis-server.
#   6. With the test extra: promtool (Debian's package prometheus), for the
#      Prometheus rule tests in tests/deploy; installed like redis-server when
#      root with apt-get, else a warning (those tests skip outside CI).
#   7. With the test extra: Chromium (Debian's package chromium), the browser
#      the console's tests (tests/console) drive through Playwright; installed
#      like promtool, else a warning (those tests skip outside CI).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv"
extras="${1:-test}"

say() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }

case "$extras" in
    -h | --help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[[ "$extras" =~ ^[a-z0-9_-]+(,[a-z0-9_-]+)*$ ]] || die "bad extras '$extras' (expected e.g. test, demo or demo,test)"

is_root() { [[ "$(id -u)" == 0 ]]; }

apt_install() {
    say "installing $* from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" </dev/null
}

# Two bootstraps at once (make -j, or two people in one checkout) must not
# build the same virtualenv together.
if command -v flock >/dev/null 2>&1; then
    lock="${TMPDIR:-/tmp}/fairpost-bootstrap.$(id -u).$(printf '%s' "$repo_root" | cksum | cut -d' ' -f1).lock"
    exec 9>"$lock"
    flock 9
fi

# --- 1. redis-server: first, so that a missing one fails before a long install.
if ! command -v redis-server >/dev/null 2>&1; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        apt_install redis-server
        command -v redis-server >/dev/null 2>&1 \
            || die "apt-get installed redis-server but it is not on PATH ($PATH)"
    else
        die "redis-server is not installed; the tests and the demo start their own.
    Debian/Ubuntu: sudo apt-get install redis-server
    Fedora:        sudo dnf install redis
    macOS:         brew install redis
Then run this again."
    fi
fi

# --- 2. Python >= 3.11 and the virtualenv.
python_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }

if [[ -n "${FAIRPOST_PYTHON:-}" ]]; then
    candidates=("$FAIRPOST_PYTHON")
else
    candidates=(python3.11 python3)
fi
python=""
for candidate in "${candidates[@]}"; do
    if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate"; then
        python="$candidate"
        break
    fi
done
if [[ -z "$python" ]]; then
    found="no python3"
    if command -v python3 >/dev/null 2>&1; then found="$(python3 -V 2>&1 | head -n1 || true)"; fi
    die "fairpost needs Python >= 3.11 (tried: ${candidates[*]}; found: $found).
    Install python3.11 (Debian 12's python3 is 3.11), or point FAIRPOST_PYTHON at one."
fi

if [[ -x "$venv/bin/python" ]] && ! python_ok "$venv/bin/python"; then
    say "$venv is broken or older than Python 3.11: recreating it"
    rm -rf "$venv"
fi
if [[ ! -x "$venv/bin/python" ]]; then
    if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        # Debian splits venv/ensurepip out of its python3 package.
        if is_root && command -v apt-get >/dev/null 2>&1 && [[ "$(command -v "$python")" == /usr/bin/* ]]; then
            apt_install python3-venv
        else
            die "$python cannot create virtualenvs; install its venv module (Debian/Ubuntu: python3-venv)"
        fi
    fi
    say "creating $venv with $("$python" -V 2>&1)"
    "$python" -m venv "$venv"
fi

# --- 3. The package, editable, with the extras; skipped when nothing changed.
stamp="$venv/.fairpost-installed.${extras//,/+}"
wanted="$("$venv/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' \
    "$repo_root/pyproject.toml")"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" && -x "$venv/bin/fairpost" ]]; then
    say "fairpost[$extras] is up to date in $venv"
else
    rm -f "$stamp"
    say "installing fairpost[$extras] into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    (cd "$repo_root" && "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extras]")
    printf '%s\n' "$wanted" >"$stamp"
fi

# --- 4. LocalStack, for the tests that need FIFO-faithful SQS (not for the demo).
if [[ ",$extras," == *,test,* && -f "$repo_root/scripts/install-localstack.sh" ]]; then
    if [[ -z "${FAIRPOST_LOCALSTACK_PYTHON:-}" ]] \
        && "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; then
        export FAIRPOST_LOCALSTACK_PYTHON="$python"
    fi
    bash "$repo_root/scripts/install-localstack.sh"
fi

# --- 5. stress-ng, for make test-stress only.
if [[ "${FAIRPOST_BOOTSTRAP_STRESS:-0}" == 1 ]] && ! command -v stress-ng >/dev/null 2>&1; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        apt_install stress-ng
    else
        die "stress-ng is not installed (Debian/Ubuntu: sudo apt-get install stress-ng)"
    fi
fi

# --- 6. promtool, for tests/deploy's Prometheus rule tests (test extra only).
# Debian ships it only inside the package prometheus, with the server; where
# systemd runs, the package starts that server on port 9090: stop and disable
# it, fairpost needs only promtool.
if [[ ",$extras," == *,test,* ]] && ! command -v promtool >/dev/null 2>&1; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        apt_install prometheus
        if command -v systemctl >/dev/null 2>&1; then
            systemctl disable --now prometheus >/dev/null 2>&1 || true
        fi
        command -v promtool >/dev/null 2>&1 \
            || die "apt-get installed prometheus but promtool is not on PATH ($PATH)"
    else
        say "warning: promtool is not installed; the Prometheus rule tests will be skipped (CI fails them).
    Debian/Ubuntu: sudo apt-get install prometheus
    macOS:         brew install prometheus"
    fi
fi

# --- 7. Chromium, for tests/console (test extra only). Playwright drives the
# browser binary the package installs (/usr/lib/chromium/chromium; /usr/bin/chromium
# is a launcher script); `playwright install` would download a browser of its own.
chromium_binary=/usr/lib/chromium/chromium
if [[ ",$extras," == *,test,* && ! -x "$chromium_binary" ]]; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        apt_install chromium
        [[ -x "$chromium_binary" ]] || die "apt-get installed chromium but $chromium_binary is missing"
    else
        say "warning: Chromium is not installed; the console's browser tests will be skipped (CI fails them).
    Debian/Ubuntu: sudo apt-get install chromium"
    fi
fi

say "ready"
