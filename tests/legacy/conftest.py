"""The legacy suite runs in .venv-legacy (numpy 1.23.5, protobuf 3.20.3, smdebug 1.0.34, MXNet).

It is collected only there (scripts/test.sh runs ``pytest tests/legacy`` in that venv).
"""

from __future__ import annotations

import os

os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")
os.environ.setdefault("MLTRACE_TRIAL_WAIT", "2")
