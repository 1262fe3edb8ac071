#!/usr/bin/env bash
# Install LocalStack (host mode, no Docker) into its own pinned virtualenv.
#
#   scripts/install-localstack.sh            # into <repo>/.localstack-venv
#   FAIRPOST_LOCALSTACK_VENV=/some/dir scripts/install-localstack.sh
#
# Idempotent: a marker file inside the venv records the exact pin list it was
# built with; when it matches, nothing is done. The pins are the recipe measured
# in docs/design.md ("What the emulators get wrong"): localstack-core 4.12.0 is the
# last release that runs on Python 3.11, and the other pins keep its TLS and
# CBOR dependencies on versions it works with. Installing takes about a minute.
# Set FAIRPOST_LOCALSTACK_PYTHON to use another python3.11 binary.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FAIRPOST_LOCALSTACK_VENV:-$repo_root/.localstack-venv}"
python="${FAIRPOST_LOCALSTACK_PYTHON:-python3.11}"

pins=(
    'localstack-core[runtime]==4.12.0'
    'cbor2<6'
    'cryptography==44.0.3'
    'pyopenssl==24.3.0'
    'service_identity==24.2.0'
)
marker="$venv/.fairpost-installed"
wanted="$(printf '%s\n' "${pins[@]}")"

installed() {
    [[ -f "$marker" && -x "$venv/bin/python" ]] && [[ "$(cat "$marker")" == "$wanted" ]]
}

if installed; then
    echo "localstack: already installed in $venv"
    exit 0
fi

# Two test sessions starting at once must not install into the same venv
# together: the second waits, then finds the marker.
lock="${TMPDIR:-/tmp}/fairpost-localstack-$(printf '%s' "$venv" | cksum | cut -d' ' -f1).lock"
exec 9>"$lock"
flock 9
if installed; then
    echo "localstack: already installed in $venv"
    exit 0
fi

if ! command -v "$python" >/dev/null 2>&1; then
    echo "localstack: $python not found; LocalStack 4.12 needs Python 3.11" >&2
    exit 1
fi
version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$version" != "3.11" ]]; then
    echo "localstack: $python is Python $version; LocalStack 4.12 needs Python 3.11" >&2
    exit 1
fi

echo "localstack: installing into $venv (about a minute)"
# --clear: a venv built with another pin list is rebuilt from scratch.
"$python" -m venv --clear "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
# Fail here, not at server start, if the install is unusable.
"$venv/bin/python" -c 'import localstack.runtime.main'
printf '%s\n' "$wanted" >"$marker"
echo "localstack: installed into $venv"
