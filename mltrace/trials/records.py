"""Reading records for ``Trial``: one ranged read per tensor record, checked against the CRC its
index entry stores; re-reading a step's index files when a record fails its check (a job
restarted into the same out_dir rewrites its steps); the wall time of a step; and the flight
recorder's records (mltrace.format.flight_record).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence

import numpy as np

from mltrace.exceptions import (
    CorruptRecordError,
    IndexReaderException,
    MltraceTypeError,
    TensorUnavailableForStep,
)
from mltrace.format import flight_record, paths, record_batch
from mltrace.format.crc32c import crc32c
from mltrace.format.events import WireError, decode_event, decode_tensor_payload
from mltrace.format.flight_record import FirstNonFinite, FlightRecord
from mltrace.format.index import decode_index
from mltrace.format.records import unframe_record
from mltrace.modes import ModeKeys, mode_from
from mltrace.trials.index import Location, TrialIndex
from mltrace.trials.refresh import TrialRefresh

logger = logging.getLogger("mltrace.trials")  # the name users configure: the package's


class RecordReads(TrialRefresh):
    """Reading and checking a trial's records, and its flight recorder's records."""

    # -- tensor records ------------------------------------------------------------------------
    def reload_step(self, step: int) -> bool:
        """Read the index files of global ``step`` again; True if one changed or is gone.

        A job restarted into this out_dir after a crash writes its steps again (mltrace.writer),
        so a trial that indexed the earlier run would read the new events files at the old
        offsets. Tensor reads call this when a record fails its check and, if the step changed,
        look it up again. A step whose index is gone (being rewritten: the writer removes it
        first) is dropped until a refresh finds its new index file.
        """
        changed = False
        for worker in sorted(self._index.step_workers.get(step, ())):
            key = paths.index_file_key(step, worker)
            try:
                blob = self.storage.read(key)
                index = decode_index(blob, f"{self.storage.uri}/{key}")
            except FileNotFoundError:
                index = None
            except (IndexReaderException, OSError):
                continue
            if index is not None and self._index.locations(step, worker) == (
                    TrialIndex.locations_in(index)):
                continue  # the same index: the record itself is damaged
            self._index.forget(step, worker)
            if index is not None:
                self._index.ingest(step, worker, index, zlib.crc32(blob))
            else:  # refreshes list from this key on (and skip what they read) until it is back
                self._read_keys.discard(key)
                self._rewritten.add(key)
            changed = True
        return changed

    def read_tensor(self, location: Location, tensor_name: str, step: int,
                    mode: ModeKeys | str = ModeKeys.GLOBAL) -> np.ndarray:
        """Read and check one record (one ranged read).

        Args:
            location: where the record lives, from ``index_entries``.
            tensor_name, step, mode: what the record is, for messages and errors.

        Raises:
            TensorUnavailableForStep: the events file the index lists is missing.
            CorruptRecordError: the record fails its CRC checks or is not a record of its tensor
                (``reload_step`` tells whether the step was rewritten since it was indexed).
            MltraceTypeError: a dtype this reader does not know.
        """
        try:
            record = self.storage.read(location.key, location.start, location.length)
        except FileNotFoundError:
            logger.warning("events file %s/%s listed by the index is missing; step %d of %s "
                           "skipped", self.storage.uri, location.key, step, tensor_name)
            raise TensorUnavailableForStep(tensor_name, step, mode_from(mode)) from None
        return self._decode_record(record, location)

    def read_tensors(self, locations: Sequence[Location]) -> list[np.ndarray]:
        """Read and check several records at once (in parallel on remote stores).

        Raises:
            FileNotFoundError: an events file the index lists is missing.
            CorruptRecordError, MltraceTypeError: as ``read_tensor``; read one by one with
                ``read_tensor`` to learn which record.
        """
        requests = [(loc.key, loc.start, loc.length) for loc in locations]
        records: list[bytes] = list(self.storage.read_many(requests))
        return record_batch.decode_records(records, locations, self._decode_record)

    def _decode_record(self, record: bytes, loc: Location) -> np.ndarray:
        where = f"{self.storage.uri}/{loc.key} at byte {loc.start}"
        payload = unframe_record(record, where)
        if loc.crc32c is not None and crc32c(payload) != loc.crc32c:
            raise CorruptRecordError(where, f"payload CRC32C {crc32c(payload)} differs from "
                                            f"the index's {loc.crc32c}")
        try:
            tensor = decode_tensor_payload(payload, loc.tag)
        except WireError as exc:
            raise CorruptRecordError(where, f"not a record of {loc.tag!r} ({exc})") from None
        except MltraceTypeError as exc:  # e.g. an unknown dtype: name the file it is in
            raise MltraceTypeError(f"cannot read the record in {where}: {exc}") from None
        if tensor is None:
            raise CorruptRecordError(where, "record holds no tensor")
        return tensor

    def step_wall_time(self, step: int) -> float | None:
        """When global ``step`` was written: the wall time of one of its records (None when no
        record of it can be read or none carries a wall time)."""
        for entries in self._index.tensors.values():
            by_worker = entries.values.get(step) or None
            locations = list(by_worker.values()) if by_worker else []
            if not locations and step in entries.reductions:
                locations = [loc for reds in entries.reductions[step].values()
                             for loc in reds.values()]
            for loc in locations:
                where = f"{self.storage.uri}/{loc.key}"
                try:
                    record = self.storage.read(loc.key, loc.start, loc.length)
                    wall = decode_event(unframe_record(record, where)).wall_time
                except (OSError, ValueError):
                    continue
                return wall or None
        return None

    # -- the flight recorder's records (mltrace.format.flight_record) ----------------------------
    def flight_records(self) -> list[FlightRecord]:
        """Each worker's flight recorder record: its dumps (trigger, reason, steps written
        before and after) and the first non-finite tensor it saw; empty for a trial whose hook
        had no recorder or never dumped. Read afresh at each call (a live job dumps later)."""
        return flight_record.read_records(self.storage)

    def first_nonfinite(self) -> FirstNonFinite | None:
        """The first tensor, in execution order, that held a NaN or an infinity: the earliest
        over the trial's workers (lowest step, then worker name), or None if no recorder saw
        one. Its ``tensor``, ``step``, ``mode``, ``worker`` and ``phase`` say which and when."""
        return flight_record.first_nonfinite(self.storage)
