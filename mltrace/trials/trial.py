"""Trial, smdebug's analysis API over a trial directory (``create_trial`` opens one).

Index-driven: a refresh lists only index files it has not read (``start_after`` the last complete
step), reads them, and records where each record lives; a value is then one ranged read of one
record, checked against the CRC the index stores. A trial opened during training sees new steps
as they land and learns that training ended from ``training_job_end.ts``.

``Trial`` joins its parts, each a class in its own module: loading the index files and step
completeness (:mod:`~mltrace.trials.refresh`), step, mode and worker queries
(:mod:`~mltrace.trials.steps`), tensor-name and collection queries (:mod:`~mltrace.trials.names`)
and reading records (:mod:`~mltrace.trials.records`). This module holds the constructor, the
Tensor objects, and the keyword checks that ``create_trial`` shares.
"""

from __future__ import annotations

import difflib
import inspect
import os
from typing import TYPE_CHECKING, Any

from mltrace.collections import Collection
from mltrace.exceptions import MltraceTypeError, TensorUnavailable
from mltrace.storage import open_storage

# Location and TensorEntries are part of the reader API (index_entries returns them).
from mltrace.trials.index import Location as Location
from mltrace.trials.index import TensorEntries as TensorEntries
from mltrace.trials.index import TrialIndex
from mltrace.trials.names import NameQueries
from mltrace.trials.records import RecordReads
from mltrace.trials.refresh import (
    DEFAULT_CREATE_TIMEOUT,
    POLL_INTERVAL,
    env_seconds,
    incomplete_step_window_from_env,
)
from mltrace.trials.steps import StepQueries
from mltrace.trials.steps import StepState as StepState
from mltrace.trials.tensor import Tensor

if TYPE_CHECKING:
    from mltrace.diagnosis import Diagnosis


class Trial(StepQueries, NameQueries, RecordReads):
    """A training run's saved tensors.

    Args:
        path: the hook's out_dir (local path or a URI of an installed storage backend).
        name: a display name (default: the last path component).
        range_steps: (begin, end) global steps to load, end exclusive; None loads all.
        timeout: seconds to wait for the first collections file before raising
            MissingCollectionFiles (default 10, or MLTRACE_TRIAL_WAIT).
        poll_interval: seconds between polls while waiting.
        check: smdebug's argument, accepted so that smdebug calls run; no effect (every record is
            checked against the CRC its index entry stores).
        index_mode: smdebug's argument (its only supported mode); no effect.
        cache: smdebug's argument; no effect (values are read when asked for).
        parallel: smdebug's argument; no effect (remote stores fetch batches in parallel).

    Raises:
        MltraceTypeError: an unknown keyword argument (the message lists the valid ones).
        MissingCollectionFiles: no collections file appeared within ``timeout``.

    Beside smdebug's API, the reader API that Tensor, the rules and the plugins build on:
    ``index_entries``, ``tensor_count``, ``saved_steps``, ``is_step_complete``,
    ``to_global_step``, ``to_mode_steps``, ``read_tensor``, ``read_tensors``, ``reload_step``,
    ``raise_for_missing_step`` and ``step_wall_time``.
    """

    def __init__(
        self,
        path: str,
        name: str | None = None,
        range_steps: tuple[int | None, int | None] | None = None,
        timeout: float | None = None,
        poll_interval: float = POLL_INTERVAL,
        *,
        check: bool = False,
        index_mode: bool = True,
        cache: bool = False,
        parallel: bool = True,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise unknown_keywords("Trial", unknown, trial_keywords())
        self.path = path.strip()
        self.name = name or os.path.basename(self.path.rstrip("/")) or self.path
        self.storage = open_storage(self.path)
        self.range_steps = range_steps
        self.poll_interval = poll_interval
        self._index = TrialIndex()
        self._read_keys = set()
        self._rewritten = set()  # index files being rewritten, see reload_step
        self._token = None
        self.loaded_all_steps = False
        self.last_complete_step = -1
        self.dynamic_refresh = True
        self.skipped_files = []
        self._workers = set()
        self._last_refresh = 0.0
        #: saved steps a live reader waits for a lagging worker before counting them complete
        self.incomplete_step_window = incomplete_step_window_from_env()
        #: seconds between automatic refreshes: none locally, 1 s on remote stores
        self.refresh_interval = 0.0 if self.storage.is_local else 1.0
        if timeout is None:
            timeout = env_seconds("MLTRACE_TRIAL_WAIT", DEFAULT_CREATE_TIMEOUT)
        self._load_collections(timeout)
        self.refresh_data()

    # -- tensors ------------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        """The Tensor ``name``.

        Raises:
            TensorUnavailable: no such tensor (yet).
        """
        if not self.has_tensor(name):
            raise TensorUnavailable(name)
        return Tensor(name, self)

    def tensors_in_collection(self, coll: str | Collection) -> list[Tensor]:
        """Tensor objects of the tensors that belong to a collection."""
        return [self.tensor(n) for n in self.tensor_names(collection=coll)]

    def diagnose(self, step: int | None = None, worker: str | None = None) -> Diagnosis:
        """Why the run broke: the first anomaly (or ``step``), where it began and its likely
        cause, with the evidence, from ``worker``'s tensors (default: the first worker's;
        mltrace.diagnosis; ``mltrace diagnose`` prints the same)."""
        from mltrace.diagnosis import diagnose

        return diagnose(self, step, worker=worker)

    def __repr__(self) -> str:
        return f"<Trial {self.name!r} at {self.path!r}: {len(self._index.step_workers)} steps>"


def trial_keywords() -> list[str]:
    """The keyword arguments Trial (and so create_trial) takes, in signature order."""
    params = inspect.signature(Trial.__init__).parameters.values()
    return [p.name for p in params
            if p.name not in ("self", "path") and p.kind is not p.VAR_KEYWORD]


def unknown_keywords(where: str, unknown: dict[str, Any], valid: list[str]) -> MltraceTypeError:
    """The error for keyword arguments ``where`` does not take: each named, with the closest
    valid one (difflib) and the full list."""
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, valid, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return MltraceTypeError(
        f"{where}() got unknown keyword argument(s) {', '.join(hints)}; "
        f"valid keyword arguments are: {', '.join(valid)}"
    )
