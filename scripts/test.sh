#!/usr/bin/env bash
# The whole test suite: builds (or reuses) both environments, runs ruff, mypy and the import
# contracts (config in pyproject.toml), the documentation site's strict build (mkdocs.yml), then
# the main suite in .venv (printing its 15 slowest tests) and the legacy suite (MXNet, real
# smdebug 1.0.34 cross-checks) in .venv-legacy.
# Every step runs even when an earlier one fails, so one run reports everything; the script fails if
# ruff, mypy, the import contracts or the site's build report anything, if either suite fails, or
# if either suite collects no test.
# Markers (pyproject.toml): slow, server, browser, legacy; e.g. `scripts/test.sh -m "not slow"`.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all || exit 1
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONDONTWRITEBYTECODE=1
mkdir -p test-artifacts

echo "=== ruff check (.venv) ==="
.venv/bin/ruff check .
ruff=$?
echo "=== mypy: mltrace, mltrace_tb, mltrace_mlflow (.venv) ==="
.venv/bin/mypy
mypy=$?
echo "=== import contracts: the layers of docs/architecture.md (.venv) ==="
.venv/bin/lint-imports
layers=$?
echo "=== documentation site: mkdocs build --strict (.venv; broken links and references fail) ==="
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site"
docs=$?
rm -rf "$site"

echo "=== main suite (.venv) ==="
.venv/bin/python -m pytest tests --ignore=tests/legacy -p no:cacheprovider --durations=15 "$@"
main=$?
echo "=== legacy suite (.venv-legacy: MXNet 1.9.1, smdebug 1.0.34) ==="
.venv-legacy/bin/python -m pytest tests/legacy -p no:cacheprovider "$@"
legacy=$?

echo "ruff exit code: $ruff; mypy exit code: $mypy; import contracts exit code: $layers; docs exit code: $docs; main suite exit code: $main; legacy suite exit code: $legacy"
# pytest exit code 5 means no test ran: that is a failure here, not a pass.
[ "$ruff" -eq 0 ] && [ "$mypy" -eq 0 ] && [ "$layers" -eq 0 ] && [ "$docs" -eq 0 ] && [ "$main" -eq 0 ] && [ "$legacy" -eq 0 ]
