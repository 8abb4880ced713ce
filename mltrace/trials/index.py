"""The in-memory index of a trial: which tensor, reduction and shape lives where, per step and
worker, plus the step <-> (mode, mode step) maps. Built from index files; knows no storage."""

from __future__ import annotations

import sys
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from mltrace.format.index import StepIndex
from mltrace.modes import ModeKeys
from mltrace.reductions import parse_reduction_tensor_name


@dataclass(slots=True, unsafe_hash=True)
class Location:
    """One record: events file key, byte range, payload CRC (None in smdebug-written trials),
    and the tensor name the index gives it, which the record's own tag must repeat (left out of
    ==: two Locations are the same record whatever name they were looked up by).

    Read-only by contract, not frozen: a frozen dataclass sets each field through
    ``object.__setattr__``, which made creating the million Locations of a large trial take
    three times as long."""

    key: str
    start: int
    length: int
    crc32c: int | None
    tag: str | None = field(default=None, compare=False)


class TensorEntries:
    """Everything stored for one tensor name: per global step, per worker."""

    __slots__ = ("values", "reductions", "shapes")

    def __init__(self) -> None:
        self.values: dict[int, dict[str, Location]] = {}
        self.reductions: dict[int, dict[str, dict[tuple[str, bool], Location]]] = {}
        self.shapes: dict[int, dict[str, tuple[int, ...]]] = {}

    def global_steps(self) -> set[int]:
        """Global steps with a value, a reduction or a shape."""
        return set(self.values) | set(self.reductions) | set(self.shapes)


class TrialIndex:
    """Lookups over every index file ingested so far."""

    def __init__(self) -> None:
        self.tensors: dict[str, TensorEntries] = {}
        self.step_workers: dict[int, set[str]] = defaultdict(set)
        self.global_to_mode: dict[int, tuple[ModeKeys, int]] = {}
        self.mode_to_global: dict[ModeKeys, dict[int, int]] = defaultdict(dict)
        #: CRC-32 of each index file's bytes, per (global step, worker): what a cache of values
        #: read from the step checks to know that the step is still the one it read.
        self.checksums: dict[tuple[int, str], int] = {}
        self._sorted: dict[ModeKeys, list[int]] = {}
        #: Each record name seen: the name interned, and what parse_reduction_tensor_name makes
        #: of it (the same names recur every step: each is split, and kept, once).
        self._parse: dict[str, tuple[str, tuple[str, str, bool] | None]] = {}

    def sorted_steps(self, mode: ModeKeys) -> list[int]:
        """Every step seen in ``mode`` (mode steps; global steps for GLOBAL), sorted; cached
        until the next ingest, so that step lookups on long runs stay logarithmic."""
        cached = self._sorted.get(mode)
        if cached is None:
            if mode is ModeKeys.GLOBAL:
                cached = sorted(self.step_workers)
            else:
                cached = sorted(self.mode_to_global.get(mode, {}))
            self._sorted[mode] = cached
        return cached

    def ingest(self, step: int, worker: str, index: StepIndex, checksum: int | None = None) -> None:
        """Add one index file's content (global step and worker come from its file name;
        ``checksum``: the CRC-32 of its bytes, when known)."""
        self._sorted.clear()
        if checksum is not None:
            self.checksums[(step, worker)] = checksum
        self.step_workers[step].add(worker)
        self.global_to_mode[step] = (index.mode, index.mode_step)
        self.mode_to_global[index.mode][index.mode_step] = step
        if index.mode is not ModeKeys.GLOBAL:
            self.mode_to_global[ModeKeys.GLOBAL][step] = step
        key = index.event_file_name or ""
        parse = self._parse
        for entry in index.tensors:
            seen = parse.get(entry.tensorname)
            if seen is None:  # the first record of this name: intern and split it once
                name = sys.intern(entry.tensorname)
                seen = parse[name] = (name, parse_reduction_tensor_name(name))
            name, parsed = seen
            loc = Location(key, entry.start_idx, entry.length, entry.crc32c, name)
            if parsed is not None:
                base, red, is_abs = parsed
                by_step = self._entries(base).reductions
                by_worker = by_step.get(step)
                if by_worker is None:
                    by_worker = by_step[step] = {}
                mine = by_worker.get(worker)
                if mine is None:
                    mine = by_worker[worker] = {}
                mine[(red, is_abs)] = loc
            else:
                values = self._entries(name).values
                got = values.get(step)
                if got is None:
                    values[step] = {worker: loc}
                else:
                    got[worker] = loc
        for shape in index.shapes:
            entries = self._entries(shape.tensorname)
            entries.shapes.setdefault(step, {})[worker] = shape.shape

    def step_checksum(self, step: int) -> int | None:
        """One CRC-32 over the index files of global ``step`` (each worker's, in worker order),
        None when the step is unknown or a file's checksum is: equal checksums mean the same
        records at the same places, since an index names each record's bytes and their CRC."""
        workers = self.step_workers.get(step)
        if not workers:
            return None
        parts = []
        for worker in sorted(workers):
            crc = self.checksums.get((step, worker))
            if crc is None:
                return None
            parts.append(f"{worker}:{crc}")
        return zlib.crc32(";".join(parts).encode())

    def _entries(self, name: str) -> TensorEntries:
        """The entries of tensor ``name``, made on first sight (not with setdefault, which would
        build and drop one TensorEntries per record: a fifth of opening a 1M-record trial)."""
        found = self.tensors.get(name)
        if found is None:
            found = self.tensors[name] = TensorEntries()
        return found

    def locations(self, step: int, worker: str) -> dict[tuple[str, str, bool], Location]:
        """What one index file added: {(tensor, reduction or "", abs): Location} (a scan over
        every tensor name; only used when a record fails its check)."""
        found = {}
        for name, entries in self.tensors.items():
            if (loc := entries.values.get(step, {}).get(worker)) is not None:
                found[(name, "", False)] = loc
            for (red, is_abs), loc in entries.reductions.get(step, {}).get(worker, {}).items():
                found[(name, red, is_abs)] = loc
        return found

    @staticmethod
    def locations_in(index: StepIndex) -> dict[tuple[str, str, bool], Location]:
        """The same for an index file not ingested (to compare with ``locations``)."""
        found = {}
        for entry in index.tensors:
            loc = Location(index.event_file_name or "", entry.start_idx, entry.length, entry.crc32c)
            parsed = parse_reduction_tensor_name(entry.tensorname)
            found[parsed if parsed is not None else (entry.tensorname, "", False)] = loc
        return found

    def forget(self, step: int, worker: str) -> None:
        """Drop what one index file added: its step is being rewritten (Trial.reload_step)."""
        self._sorted.clear()
        self.checksums.pop((step, worker), None)
        for name in list(self.tensors):
            entries = self.tensors[name]
            for table in (entries.values, entries.reductions, entries.shapes):
                by_worker = table.get(step)
                if by_worker is not None:
                    by_worker.pop(worker, None)
                    if not by_worker:
                        del table[step]
            if not entries.global_steps():
                del self.tensors[name]
        workers = self.step_workers.get(step)
        if workers is not None:
            workers.discard(worker)
        if not workers:
            self.step_workers.pop(step, None)
            known = self.global_to_mode.pop(step, None)
            if known is not None and self.mode_to_global[known[0]].get(known[1]) == step:
                del self.mode_to_global[known[0]][known[1]]
            self.mode_to_global[ModeKeys.GLOBAL].pop(step, None)

    def to_global(self, step: int, mode: ModeKeys) -> int | None:
        """The global step of mode step ``step`` (GLOBAL steps are global steps)."""
        if mode is ModeKeys.GLOBAL:
            return step if step in self.global_to_mode else None
        return self.mode_to_global.get(mode, {}).get(step)

    def steps_of(self, global_steps: Iterable[int], mode: ModeKeys) -> list[int]:
        """``global_steps`` as sorted steps of ``mode`` (mode steps; global steps for GLOBAL)."""
        if mode is ModeKeys.GLOBAL:
            return sorted(global_steps)
        out = []
        for g in global_steps:
            known = self.global_to_mode.get(g)
            if known is not None and known[0] is mode:
                out.append(known[1])
        return sorted(out)

    def modes(self) -> list[ModeKeys]:
        """Modes seen, GLOBAL left out unless only GLOBAL steps exist (smdebug)."""
        return sorted({m for m, _ in self.global_to_mode.values()}, key=lambda m: m.value)
