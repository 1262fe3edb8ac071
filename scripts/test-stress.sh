#!/usr/bin/env bash
# The whole test suite while stress-ng keeps every core busy: CI machines and
# users' laptops are busy too, and a test that passes only on an idle machine
# is a defect. The stressor is stopped however the suite ends.
#
#   scripts/test-stress.sh [PYTEST_ARGS...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

command -v stress-ng >/dev/null 2>&1 || {
    echo "test-stress: stress-ng is not installed (FAIRPOST_BOOTSTRAP_STRESS=1 scripts/bootstrap.sh installs it)" >&2
    exit 1
}
workers="${FAIRPOST_STRESS_CPUS:-$(nproc)}"
# Its own process group, so that the trap ends every worker it forks.
setsid stress-ng --cpu "$workers" --timeout 0 --quiet &
stressor=$!
trap 'kill -TERM -- "-$stressor" 2>/dev/null || true; wait "$stressor" 2>/dev/null || true' EXIT
echo "test-stress: stress-ng --cpu $workers running (pid $stressor)"
.venv/bin/pytest "$@"
