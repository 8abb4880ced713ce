"""Run-context provider (entry point ``mlflow.run_context_provider``): every MLflow run started
with ``mlflow.start_run`` while an mltrace hook is open in the process records the mltrace
version and the hook's trial location as tags, whether or not the hook itself logs to MLflow.

MLflow loads this module while ``import mlflow`` runs, so it imports only MLflow's abstract base
and mltrace's core (no framework, no heavy import).
"""

from __future__ import annotations

import os

from mlflow.tracking.context.abstract_context import RunContextProvider

from mltrace import __version__
from mltrace.capture.hook import get_hook

from ._keys import TAG_TRIAL, TAG_VERSION

#: A trial location for processes without a hook (e.g. a rule job): recorded when set.
TRIAL_ENV = "MLTRACE_TRIAL"


def _trial() -> str | None:
    hook = get_hook()
    if hook is not None and not getattr(hook, "closed", False):
        out_dir = hook.out_dir
        return out_dir if "://" in out_dir else os.path.abspath(out_dir)
    return os.environ.get(TRIAL_ENV) or None


class MltraceRunContextProvider(RunContextProvider):
    """Tags ``mltrace.version`` and ``mltrace.trial`` while a hook is open (or MLTRACE_TRIAL is
    set)."""

    def in_context(self) -> bool:
        """True while an mltrace hook is open in this process, or MLTRACE_TRIAL is set."""
        return _trial() is not None

    def tags(self) -> dict[str, str]:
        """The tags for a run starting now."""
        trial = _trial()
        out = {TAG_VERSION: __version__}
        if trial:
            out[TAG_TRIAL] = trial
        return out
