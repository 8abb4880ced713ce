"""mltrace run's bootstrap: imported by Python at start-up because ``mltrace run`` put this
folder on PYTHONPATH. It activates mltrace for the process (mltrace.launch.process), then runs
the ``sitecustomize`` that this one hides, if the environment has one."""

import importlib
import os
import sys


def _activate() -> None:
    try:
        from mltrace.launch.process import activate

        activate()
    except Exception as exc:  # noqa: BLE001 - never keep the user's program from starting
        sys.stderr.write(f"mltrace run: not attached ({type(exc).__name__}: {exc})\n")


def _chain() -> None:
    """Import the next sitecustomize on sys.path, as if this one did not exist."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved


_activate()
_chain()
