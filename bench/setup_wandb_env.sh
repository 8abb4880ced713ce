#!/usr/bin/env bash
# A bench-only environment with W&B, for comparing mltrace with wandb.watch side by side
# (bench/pytorch_overhead.py --lib none,mltrace,wandb). W&B is never a dependency of mltrace: this
# venv layers wandb over the main .venv (a .pth file adds .venv's site-packages as a site dir), so
# torch and mltrace are the very same as in the library's tests. Builds .venv-bench-wandb/.
set -euo pipefail
cd "$(dirname "$0")/.."
WANDB_VERSION=0.31.0
bash scripts/setup.sh main
if [ ! -x .venv-bench-wandb/bin/python ] || ! .venv-bench-wandb/bin/python -c "import wandb" 2>/dev/null; then
  rm -rf .venv-bench-wandb
  "${PYTHON:-python3}" -m venv .venv-bench-wandb
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  layer=$(.venv-bench-wandb/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # addsitedir, not a bare path: .venv's own .pth files (mltrace's editable install) must run too
  echo "import site; site.addsitedir('$site')" > "$layer/_mltrace_main_venv.pth"
  .venv-bench-wandb/bin/pip install --quiet "wandb==$WANDB_VERSION"
fi
.venv-bench-wandb/bin/python -c "import wandb, torch, mltrace; print('wandb', wandb.__version__, 'torch', torch.__version__)"
