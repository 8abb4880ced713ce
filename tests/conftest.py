"""Shared fixtures. Tests use tmp_path and loopback only; see STYLE.md, Testing habits."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Trials opened on an empty directory in tests should fail fast unless a test says otherwise.
os.environ.setdefault("MLTRACE_TRIAL_WAIT", "2")
