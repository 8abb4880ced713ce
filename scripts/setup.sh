#!/usr/bin/env bash
# Build (or reuse) the two virtual environments mltrace needs, and the Debian packages its UI tests use.
#   .venv/         main: torch, tensorflow, xgboost, tensorboard, mlflow, boto3, S3 server, test tools
#   .venv-legacy/  MXNet 1.9.1 and real smdebug 1.0.34 (numpy 1.23.5, protobuf 3.20.3)
# A venv is reused when its stamp matches the requirements file it was built from (otherwise it is
# rebuilt); mltrace itself is reinstalled (editable, seconds) when setup.cfg changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

build_venv() {  # build_venv DIR REQUIREMENTS
  local dir=$1 req=$2 stamp pkg
  stamp=$(sha256sum "$req" | cut -c1-16)
  pkg=$(sha256sum setup.cfg | cut -c1-16)
  if [ -f "$dir/.mltrace-stamp" ] && [ "$(cat "$dir/.mltrace-stamp")" = "$stamp" ]; then
    if [ "$(cat "$dir/.mltrace-pkg-stamp" 2>/dev/null)" != "$pkg" ]; then
      echo "[setup] setup.cfg changed: reinstalling mltrace into $dir"
      "$dir/bin/pip" install --quiet --no-deps --no-build-isolation -e .
      echo "$pkg" > "$dir/.mltrace-pkg-stamp"
    fi
    echo "[setup] $dir is complete (stamp $stamp), reusing it"
    return
  fi
  echo "[setup] building $dir from $req"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install --quiet --upgrade pip==25.3 || true
  "$dir/bin/pip" install --quiet -r "$req"
  # mltrace itself, editable, without letting pip touch the pinned set.
  "$dir/bin/pip" install --quiet --no-deps --no-build-isolation -e .
  "$dir/bin/pip" check
  echo "$pkg" > "$dir/.mltrace-pkg-stamp"
  echo "$stamp" > "$dir/.mltrace-stamp"
}

install_debian_packages() {
  # Headless Chromium and its driver for the TensorBoard plugin's browser test (never a browser download),
  # PostgreSQL for the MLflow-on-PostgreSQL tests (initdb/pg_ctl under /usr/lib/postgresql/*/bin), and
  # node for the frontend's unit tests.
  local missing=()
  if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    missing+=(chromium chromium-driver)
  fi
  if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
  fi
  # node for the unit tests of the TensorBoard tab's frontend (node --test tests/js/)
  if ! command -v node >/dev/null; then
    missing+=(nodejs)
  fi
  if [ ${#missing[@]} = 0 ]; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "[setup] ${missing[*]} missing and not root: run 'sudo apt-get install ${missing[*]}'" >&2
    return
  fi
  echo "[setup] installing ${missing[*]} with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

case "${1:-all}" in
  main) build_venv .venv requirements/main.txt ;;
  legacy) build_venv .venv-legacy requirements/legacy.txt ;;
  all)
    build_venv .venv requirements/main.txt
    build_venv .venv-legacy requirements/legacy.txt
    install_debian_packages
    ;;
  *) echo "usage: scripts/setup.sh [main|legacy|all]" >&2; exit 2 ;;
esac
