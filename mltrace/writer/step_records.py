"""The records of one (global step, worker) being assembled in memory, encoded as they are
added, and the two files they become: the step's events file and its index.

Every record of a step carries one wall time, that of its first record, so that the bytes before
each value are built once a step (mltrace.format.event_batch); one-number records (a step's
reductions) are encoded as one block (mltrace.format.scalar_block). The encoders are the trial
writer's, one per worker, since they keep what they built for the tensors they saw.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np

from mltrace.format import paths
from mltrace.format.event_batch import EncodedRecords, EventBatchEncoder
from mltrace.format.index import StepIndex, encode_index
from mltrace.format.scalar_block import ScalarBlockEncoder
from mltrace.modes import ModeKeys


class StepRecords:
    """The open step of a trial writer."""

    def __init__(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        self.step = step
        self.index = StepIndex(mode=mode, mode_step=mode_step, event_file_name=None)
        #: the events file's records (its bytes in ``parts``, in order), which the index lists
        self.records = EncodedRecords()
        #: the wall time of the step's records: when its first one was added
        self.wall_time: float | None = None

    @property
    def empty(self) -> bool:
        """True while the step holds neither a record nor a shape."""
        return not self.records.names and not self.index.shapes

    def _now(self) -> float:
        if self.wall_time is None:
            self.wall_time = time.time()
        return self.wall_time

    def add_tensors(self, encoder: EventBatchEncoder, records: Iterable[tuple[str, np.ndarray]],
                    mode: ModeKeys, mode_step: int, wall_time: float | None = None) -> None:
        """Append tensor records (name, value), with the step's wall time unless one is given."""
        encoder.encode(records, self.step, mode, mode_step, self._now() if wall_time is None else wall_time,
                       self.records)

    def add_scalars(self, encoder: ScalarBlockEncoder, names: Sequence[str], integer: Sequence[bool],
                    values: np.ndarray, mode: ModeKeys, mode_step: int) -> None:
        """Append one-number records (``values`` as float64, an int64 where ``integer``) as one
        block: the same bytes as :meth:`add_tensors` of 0-d arrays."""
        encoder.encode(names, integer, values, self.step, mode, mode_step, self._now(), self.records)

    def files(self, worker: str, joined: bool) -> list[tuple[str, bytes | list[bytes] | None]]:
        """The step's files for ``worker``: its events file (its parts, or ``joined`` into one
        bytes object: the values' second and last copy) if it holds records, then its index."""
        out: list[tuple[str, bytes | list[bytes] | None]] = []
        if self.records.names:
            key = paths.event_file_key(self.step, worker)
            self.index.event_file_name = key
            parts = self.records.parts
            out.append((key, b"".join(parts) if joined else parts))
        out.append((paths.index_file_key(self.step, worker), encode_index(self.index, self.records)))
        return out
