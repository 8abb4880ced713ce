#!/usr/bin/env bash
# The main job: builds (or reuses) the environments, then runs the demo.
#   bash scripts/demo.sh [ARGS...]       a small transformer trained with a fault injected mid-run
#                                        (examples/transformer_demo.py ARGS: --steps, --fault-step,
#                                        --out-dir; --help lists them): the flight recorder's dump,
#                                        the rules' findings, and where to look in TensorBoard/MLflow
#   bash scripts/demo.sh mlp [ARGS...]   the earlier demo, a healthy MLP in TRAIN and EVAL modes
#                                        (examples/demo.py ARGS)
# Outputs go to demo-output/ (a trial per run, MLflow's SQLite store beside them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
case "${1:-}" in
  mlp) shift; exec .venv/bin/python examples/demo.py "$@" ;;
  transformer) shift ;;
esac
exec .venv/bin/python examples/transformer_demo.py "$@"
