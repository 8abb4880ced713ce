#!/usr/bin/env bash
# The main job: builds (or reuses) the environments, trains a small PyTorch model with the mltrace
# hook, analyses the trial, and prints where everything is.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
exec .venv/bin/python examples/demo.py "$@"
