#!/usr/bin/env bash
# The whole test suite: builds (or reuses) both environments, then runs the main suite in .venv
# and the legacy suite (MXNet, real smdebug 1.0.34 cross-checks) in .venv-legacy.
# Fails if either fails, or if either collects no test.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all || exit 1
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONDONTWRITEBYTECODE=1
mkdir -p test-artifacts

echo "=== main suite (.venv) ==="
.venv/bin/python -m pytest tests --ignore=tests/legacy -p no:cacheprovider "$@"
main=$?
echo "=== legacy suite (.venv-legacy: MXNet 1.9.1, smdebug 1.0.34) ==="
.venv-legacy/bin/python -m pytest tests/legacy -p no:cacheprovider "$@"
legacy=$?

echo "main suite exit code: $main; legacy suite exit code: $legacy"
# pytest exit code 5 means no test ran: that is a failure here, not a pass.
[ "$main" -eq 0 ] && [ "$legacy" -eq 0 ]
