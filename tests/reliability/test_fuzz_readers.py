"""Fuzzing every reader entry point with damaged bytes (hypothesis).

Inputs are random bytes and mutations of valid files (bit flips, byte sets, truncations,
insertions, deletions, splices, "interesting" integers and JSON values). The property, for each
entry point: it returns a correct value (equal to the original wherever a checksum covers the
bytes), or raises an mltrace exception (MltraceError: never a raw IndexError, struct.error,
UnicodeDecodeError, KeyError, RecursionError, OverflowError or MemoryError), or skips the
damaged step with a warning that names the file; it never hangs (pytest-timeout) and never
allocates much more memory than its input holds (tracemalloc), whatever a length field claims.

Examples are derandomized so that CI runs the same inputs every time; set MLTRACE_FUZZ_SCALE=10
(for example) to try ten times as many. The number of inputs tried per entry point is printed at
the end of the module ("corrupt inputs tried: ...").
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import struct
import tempfile
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mltrace import cli
from mltrace.collections import CollectionManager
from mltrace.exceptions import CorruptRecordError, IndexReaderException, MltraceError
from mltrace.format import _wire as w
from mltrace.format.crc32c import crc32c, masked_crc32c
from mltrace.format.events import decode_event, decode_tensor_payload
from mltrace.format.index import decode_index
from mltrace.format.records import OVERHEAD_BYTES, frame_record, iter_records, unframe_record
from mltrace.format.tensors import BFloat16Bits, decode_tensor, encode_tensor
from mltrace.rules.results import RuleResult, read_results
from mltrace.trials import create_trial
from mltrace_tb import rules_view, views
from tests.support.damaged_trials import (
    Pristine,
    assert_same_value,
    collections_file,
    copy_trial,
    events_file,
    index_file,
    open_trial,
    payloads,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SMDEBUG_RUN = GOLDEN / "smdebug_1.0.34" / "pytorch_run"
SCALE = float(os.environ.get("MLTRACE_FUZZ_SCALE", "1"))
#: No entry point may hold more than this much new memory for one (small) input.
MEMORY_LIMIT = 64 << 20

#: damaged inputs made, per kind of file
INPUTS: Counter[str] = Counter()
#: reader calls on them, per entry point and outcome ("ok", "error", "skipped")
TRIED: dict[str, Counter[str]] = {}


def fuzz_settings(examples: int) -> settings:
    """Derandomized (the same inputs on every run), no deadline, no example database."""
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=True,
                    database=None, suppress_health_check=list(HealthCheck))


def tally(entry_point: str, outcome: str) -> None:
    """Count one reader call and how it ended."""
    TRIED.setdefault(entry_point, Counter())[outcome] += 1


@pytest.fixture(scope="module", autouse=True)
def report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the inputs tried per entry point once the module's tests ran (for docs/reliability.md)."""
    yield
    calls = sum(sum(c.values()) for c in TRIED.values())
    kinds = ", ".join(f"{kind} {n}" for kind, n in INPUTS.items())
    parts = [f"{name} {sum(c.values())} ({', '.join(f'{k} {v}' for k, v in sorted(c.items()))})"
             for name, c in TRIED.items()]
    line = (f"corrupt inputs tried: {sum(INPUTS.values())} ({kinds}); reader calls on them: "
            f"{calls} ({'; '.join(parts)})")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:  # pragma: no cover - without pytest's terminal
        print(line)
        return
    with capture.global_and_fixture_disabled():  # shown even under -q and output capture
        reporter.write_line(line)


@contextlib.contextmanager
def bounded_memory(limit: int = MEMORY_LIMIT) -> Iterator[None]:
    """Fail if the block's peak of newly traced memory passes ``limit`` bytes (numpy's arrays and
    Python's bytes are traced at the size asked for, so a 2**33-byte read(n) counts in full).
    Tracing only the block: tracing hypothesis' own work too would triple the run time."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"held {peak} bytes for one damaged input"


class Warnings(logging.Handler):
    """Collects the warnings mltrace logs while one input is read."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def logged_warnings() -> Iterator[Warnings]:
    handler = Warnings()
    logger = logging.getLogger("mltrace")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def outcome_of(entry_point: str, call: Callable[[], Any], traced: bool = True) -> tuple[str, Any]:
    """Run one reader call on damaged input: ("ok", result) or ("error", the MltraceError).
    Anything else escaping fails the test, which is the point. ``traced`` bounds its memory."""
    try:
        with bounded_memory() if traced else contextlib.nullcontext():
            result = call()
    except MltraceError as exc:
        tally(entry_point, "error")
        return "error", exc
    tally(entry_point, "ok")
    return "ok", result


# -- mutations ----------------------------------------------------------------------------------

INTERESTING_CHUNKS = [
    b"\xff" * 8, b"\x00" * 8, struct.pack("<Q", 1 << 60), struct.pack("<Q", (1 << 64) - 1),
    struct.pack("<Q", 1 << 33), b"\x80" * 11, b"\xff\xff\xff\xff\x0f", b"\xff" * 9 + b"\x01",
    b"\xc3\x28", b"\xed\xa0\x80", b"1e400", b"NaN", b"-1", b"[" * 50_000, b"{" * 2_000, b'"',
    b"null", b"{}", b"[]", b"\x12\x04\x12\x02\x08\x63",
]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid file of ``seeds`` with one to four byte-level mutations."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "splice", "chunk"]))
        n = len(data)
        pos = draw(st.integers(0, max(n - 1, 0)))
        if op == "flip" and n:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and n:
            data[pos] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[draw(st.integers(0, n)):]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=24))
        elif op == "delete" and n:
            del data[pos:pos + draw(st.integers(1, 32))]
        elif op == "splice":
            src = draw(st.sampled_from(seeds))
            a = draw(st.integers(0, len(src)))
            b = draw(st.integers(a, min(len(src), a + 256)))
            end = pos + draw(st.integers(0, 64))
            data[pos:end] = src[a:b]
        elif op == "chunk":
            chunk = draw(st.sampled_from(INTERESTING_CHUNKS))
            if draw(st.booleans()):
                data[pos:pos + len(chunk)] = chunk
            else:
                data[pos:pos] = chunk
    return bytes(data)


#: stands for a value nested 5000 deep (json.dumps itself cannot write one)
DEEP = "__deep__"
INTERESTING_JSON: list[Any] = [
    -1, 0, 1, 15, 2**31, 2**33, 2**60, 2**64, float("inf"), float("nan"), 1.5, -0.0, True, None,
    "", "x", "0", "../etc", "events//x", "/abs", "TRAIN", "GLOBAL", "mro", "\udc80", [], {},
    [1, "a"], {"a": 1}, DEEP,
]
#: whole files worth trying against any reader
INTERESTING_FILES = [b"", b"\0", b"{}", b"[]", b"null", b"[" * 50_000, b'{"a":' * 5_000, b"\xff" * 16]


def _slots(doc: Any, parent: Any = None, key: Any = None) -> Iterator[tuple[Any, Any]]:
    """(container, key) of every value inside a parsed JSON document."""
    if parent is not None:
        yield parent, key
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _slots(v, doc, k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _slots(v, doc, i)


def _fresh(value: Any) -> Any:
    """A deep copy: edits must never reach INTERESTING_JSON's own lists and dicts (hypothesis
    replays a draw and needs the same choices every time)."""
    return json.loads(json.dumps(value))


@st.composite
def json_mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid JSON file of ``seeds`` with one to three value-level edits: a value replaced by an
    interesting one or by another value of the file, a key or list item deleted or duplicated."""
    doc = json.loads(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        slots = list(_slots(doc))
        if not slots or draw(st.integers(0, 30)) == 0:
            doc = _fresh(draw(st.sampled_from(INTERESTING_JSON)))
            continue
        parent, key = draw(st.sampled_from(slots))
        op = draw(st.sampled_from(["replace", "replace", "swap", "delete", "duplicate"]))
        if op == "replace":
            parent[key] = _fresh(draw(st.sampled_from(INTERESTING_JSON)))
        elif op == "swap":
            other_parent, other_key = draw(st.sampled_from(slots))
            parent[key] = _fresh(other_parent[other_key])
        elif op == "delete":
            del parent[key]
        elif isinstance(parent, list):
            parent.insert(key, _fresh(parent[key]))
        else:
            parent[key + "_"] = parent[key]
    return json.dumps(doc).encode().replace(f'"{DEEP}"'.encode(), b"[" * 5000 + b"]" * 5000)


def damaged(seeds: list[bytes], json_seeds: bool = False) -> st.SearchStrategy[bytes]:
    """Random bytes, byte-level mutations of the seeds, and (for JSON) value-level ones."""
    options = [st.binary(max_size=512), st.sampled_from(INTERESTING_FILES), mutated(seeds), mutated(seeds)]
    if json_seeds:
        options.append(json_mutated(seeds))
    return st.one_of(*options)


# -- seeds --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-copies")


def _steps(run: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[0]) for p in (Path(run) / "index" / "000000000").iterdir())


def _payload_seeds(pristine: Pristine) -> list[bytes]:
    out = [p for s in pristine.steps for _, p in payloads(pristine.path, s)]
    for step in _steps(SMDEBUG_RUN)[:3]:
        out += [p for _, p in payloads(SMDEBUG_RUN, step)]
    return out


def _tensor_seeds() -> list[bytes]:
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4), np.array(2.5), np.array([1], dtype=np.int8),
        np.array([-3, 7], dtype=np.int16), np.array([[True, False]]), np.zeros((0, 3), np.float64),
        np.array([1 + 2j], dtype=np.complex64), np.array(["a", "bc"]), np.array([b"\x00\xff"]),
        np.array([0x3F80, 0xC000], dtype=np.uint16).view(BFloat16Bits), np.array([2**63], np.uint64),
    ]
    seeds = [encode_tensor("t", a) for a in arrays]
    shape = w.len_field(2, w.len_field(2, w.varint_field(1, 4)))
    seeds.append(w.varint_field(1, 1) + shape + w.len_field(5, struct.pack("<4f", 1, 2, 3, 4)))  # float_val
    seeds.append(w.varint_field(1, 3) + shape + w.varint_field(7, 9))  # one int_val: "fill"
    return seeds


# -- format level -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_unframe_record_and_iter_records(pristine: Pristine) -> None:
    magic_files = [events_file(pristine.path, s).read_bytes() for s in pristine.steps]
    originals = _payload_seeds(pristine)
    real_files = [b"".join(frame_record(p, real_crc=True) for p in originals[i:i + 5])
                  for i in range(0, len(originals), 5)]
    records = [frame_record(p, real_crc=real) for p in originals[:12] for real in (False, True)]
    known = set(originals)

    @fuzz_settings(400)
    @given(data=damaged(records), check=st.sampled_from(["any", "real", "magic"]))
    def one_record(data: bytes, check: str) -> None:
        INPUTS["framed records"] += 1
        status, payload = outcome_of("records.unframe_record",
                                     lambda: unframe_record(data, "fuzz", check))
        if status == "ok":
            assert len(payload) + OVERHEAD_BYTES == len(data)
            if check == "real":
                assert payload in known  # the data CRC covers the payload

    @fuzz_settings(300)
    @given(data=damaged(magic_files + real_files), check=st.sampled_from(["any", "real"]))
    def whole_file(data: bytes, check: str) -> None:
        INPUTS["events files"] += 1
        status, found = outcome_of("records.iter_records",
                                   lambda: list(iter_records(data, "fuzz.tfevents", check)))
        if status == "error":
            assert "fuzz.tfevents" in str(found)
        elif check == "real":
            assert all(p in known for _, p in found)

    one_record()
    whole_file()


def test_a_length_field_of_2_to_the_60_allocates_nothing() -> None:
    header = struct.pack("<Q", 1 << 60)
    record = header + struct.pack("<I", masked_crc32c(header)) + b"payload" + b"\0" * 4
    with bounded_memory(1 << 20):
        with pytest.raises(CorruptRecordError, match="header says"):
            unframe_record(record, "huge.tfevents")
        with pytest.raises(CorruptRecordError, match="huge.tfevents at byte 0"):
            list(iter_records(record, "huge.tfevents"))
    tally("records.unframe_record", "error")
    tally("records.iter_records", "error")
    INPUTS["framed records"] += 1


def test_size_fields_claiming_exabytes_allocate_nothing() -> None:
    """Shapes and field lengths are checked against the bytes present before anything is made."""
    huge = w.len_field(2, w.len_field(2, w.varint_field(1, 1 << 40)))
    cases = {
        "fill": w.varint_field(1, 1) + huge + w.len_field(5, struct.pack("<f", 1.0)),
        "content": w.varint_field(1, 1) + huge + w.len_field(4, b"\0" * 4),
        "strings": huge + w.len_field(8, b"a"),
        "field length": w.varint_field(1, 1) + w.key(4, w.LEN) + w.varint(1 << 62) + b"\0" * 8,
    }
    for proto in cases.values():
        with bounded_memory(1 << 20), pytest.raises(w.WireError):
            decode_tensor(proto)
        tally("tensors.decode_tensor", "error")
        INPUTS["TensorProtos"] += 1


@pytest.mark.timeout(120)
def test_decode_index(pristine: Pristine) -> None:
    seeds = [index_file(pristine.path, s).read_bytes() for s in pristine.steps]
    seeds += [p.read_bytes() for p in sorted((SMDEBUG_RUN / "index" / "000000000").iterdir())[:3]]

    @fuzz_settings(500)
    @given(data=damaged(seeds, json_seeds=True))
    def check(data: bytes) -> None:
        INPUTS["index files"] += 1
        status, index = outcome_of("index.decode_index", lambda: decode_index(data, "fuzz.json"))
        if status == "error":
            assert isinstance(index, IndexReaderException) and "fuzz.json" in str(index)
            return
        if index.tensors:
            assert isinstance(index.event_file_name, str) and index.event_file_name
        for e in index.tensors:
            assert isinstance(e.tensorname, str)
            assert type(e.start_idx) is int and e.start_idx >= 0
            assert type(e.length) is int and e.length >= OVERHEAD_BYTES
            assert e.crc32c is None or 0 <= e.crc32c < 2**32
        for s in index.shapes:
            assert isinstance(s.tensorname, str) and all(type(d) is int and d >= 0 for d in s.shape)

    check()


@pytest.mark.timeout(120)
def test_decode_event_and_tensor_payload(pristine: Pristine) -> None:
    seeds = _payload_seeds(pristine)
    by_crc = {crc32c(p): p for p in seeds}

    @fuzz_settings(500)
    @given(data=damaged(seeds))
    def check(data: bytes) -> None:
        INPUTS["Event payloads"] += 1
        status, event = outcome_of("events.decode_event", lambda: decode_event(data))
        if status == "ok":
            for value in event.values:
                assert isinstance(value.tag, str)
                assert value.tensor is None or isinstance(value.tensor, np.ndarray)
                outcome_of("events.DecodedValue.mode", lambda: value.mode)
                outcome_of("events.DecodedEvent.mode_step", lambda: event.mode_step(value))
        status, tensor = outcome_of("events.decode_tensor_payload", lambda: decode_tensor_payload(data))
        original = by_crc.get(crc32c(data))
        if status == "ok" and original is not None:  # what the reader's index CRC lets through
            assert_same_value(tensor, decode_tensor_payload(original))

    check()


@pytest.mark.timeout(120)
def test_decode_tensor() -> None:
    seeds = _tensor_seeds()
    originals = {s: decode_tensor(s) for s in seeds}

    @fuzz_settings(500)
    @given(data=damaged(seeds))
    def check(data: bytes) -> None:
        INPUTS["TensorProtos"] += 1
        status, value = outcome_of("tensors.decode_tensor", lambda: decode_tensor(data))
        if status == "ok":
            assert isinstance(value, np.ndarray)
            if data in originals:
                assert_same_value(value, originals[data])

    check()


# -- whole files: collections, rule results, trials ---------------------------------------------


def _collection_seeds(pristine: Pristine) -> list[bytes]:
    seeds = [collections_file(pristine.path).read_bytes()]
    seeds += [p.read_bytes() for p in sorted(GOLDEN.rglob("*_collections.json"))][:3]
    return seeds


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:Possible nested set:FutureWarning")  # re, on fuzzed regexes
def test_collections_loader(pristine: Pristine) -> None:
    seeds = _collection_seeds(pristine)

    @fuzz_settings(300)
    @given(data=damaged(seeds, json_seeds=True))
    def check(data: bytes) -> None:
        INPUTS["collections files"] += 1
        status, manager = outcome_of("collections.CollectionManager.from_json",
                                     lambda: CollectionManager.from_json(data, "fuzz_collections.json"))
        if status == "error":
            assert "fuzz_collections.json" in str(manager)
            return
        assert isinstance(manager.num_workers, int)
        for coll in manager.get_collections().values():  # what the TensorBoard panel shows
            coll.matches("Sequential_0.weight")
            json.dumps(coll.to_json_dict())
            coll.effective_save_config().to_json_dict()
            coll.effective_reduction_config().extra_reductions_string()

    check()


@pytest.mark.timeout(120)
def test_rule_results_loader(pristine: Pristine, scratch: Path) -> None:
    seeds = [
        RuleResult("VanishingGradient", "run", {"threshold": "0.1"}, status="IssuesFound", ended=5.0,
                   evaluated_steps=3, fired_steps=[1, 2], first_step=1, message="m").to_json().encode(),
        RuleResult("LossNotDecreasing", "run", {}, status="Error", error="boom").to_json().encode(),
    ]
    folder = copy_trial(pristine, Path(tempfile.mkdtemp(dir=scratch)) / "run")
    trial = open_trial(folder)

    @fuzz_settings(200)
    @given(files=st.lists(damaged(seeds, json_seeds=True), min_size=1, max_size=3))
    def check(files: list[bytes]) -> None:
        INPUTS["rule result files"] += len(files)
        shutil.rmtree(folder / "mltrace_rules", ignore_errors=True)
        (folder / "mltrace_rules").mkdir()
        for i, data in enumerate(files):
            (folder / "mltrace_rules" / f"R_{i}.json").write_bytes(data)
        with logged_warnings() as logged:
            status, results = outcome_of("rules.results.read_results",
                                         lambda: read_results(trial.storage))
        assert status == "ok"  # a damaged result is skipped, never fatal
        assert len(results) + len([m for m in logged.messages if "R_" in m]) == len(files)
        for r in results:
            assert isinstance(r.rule, str) and isinstance(r.status, str)
            assert isinstance(r.started, float | int) and isinstance(r.fired_steps, list)
            assert all(type(s) is int for s in r.fired_steps)
            assert isinstance(r.parameters, dict)
        outcome_of("mltrace_tb.rules_view.rules", lambda: rules_view.rules(trial, None))  # the Rules panel

    check()


def _read_everything(run: Path, pristine: Pristine | None, logged: Warnings, shown: str) -> None:
    """Open a damaged trial and read all of it through the reader API, and what the TensorBoard
    panels show of tensor ``shown``; compare every value read with ``pristine``."""
    status, trial = outcome_of("trials.create_trial", lambda: open_trial(run))
    if status == "ok" and trial.skipped_files:  # each named in a warning
        TRIED["trials.create_trial"]["ok"] -= 1
        tally("trials.create_trial", "skipped")
        assert all(any(key in m for m in logged.messages) for key in trial.skipped_files)
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # as a terminal: no lone surrogates
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), bounded_memory():
        code = cli.main(["info", str(run), "--timeout", "0"])
    assert code in (0, 2)  # 2: a one-line "mltrace: error: ..."
    tally("cli.info", "ok" if code == 0 else "error")
    if status == "error":
        return
    if pristine is not None:  # a step gone from the trial was skipped with a warning naming its index
        for step in set(pristine.steps) - set(trial.steps(show_incomplete_steps=True)):
            name = index_file(run, step).name
            assert any(name in m for m in logged.messages) or trial.num_workers > 1, (step, logged.messages)
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        known = pristine.values.get(name, {}) if pristine else {}
        for step in tensor.steps():
            status, value = outcome_of("Tensor.value", lambda: tensor.value(step), traced=False)
            if status == "ok" and pristine is not None:
                assert step in known, f"{name} at step {step} never existed"
                assert_same_value(value, known[step], f"{name} at step {step}")
            elif status == "error" and isinstance(value, CorruptRecordError):
                assert ".tfevents" in str(value)
            status, reds = outcome_of("Tensor.reduction_values", lambda: tensor.reduction_values(step), traced=False)
            if status == "ok" and pristine is not None:
                for key, red in reds.items():
                    assert_same_value(red, pristine.reductions[name][step][key], f"{name} {key} {step}")
        status, values = outcome_of("Tensor.values", lambda: tensor.values())
        if status == "ok" and pristine is not None:
            for step, value in values.items():
                assert_same_value(value, known[step], f"{name} at step {step}")
    if trial.has_tensor(shown):
        for step in trial.tensor(shown).steps():
            outcome_of("Tensor.reduction_value", lambda: trial.tensor(shown).reduction_value(step, "l2"), traced=False)
        outcome_of("mltrace_tb.views.series",
                   lambda: views.series(trial, shown, None, None, True, views.SeriesCache(), None), traced=False)
        for mode in trial.modes():
            outcome_of("mltrace_tb.views.histograms",
                       lambda: views.histograms(trial, shown, mode, None, 10, None), traced=False)
    outcome_of("mltrace_tb.views.run_summary", lambda: views.run_summary(trial), traced=False)
    outcome_of("mltrace_tb.views.collections", lambda: views.collections(trial), traced=False)


def _trial_files(run: Path) -> list[Path]:
    return sorted(p for p in Path(run).rglob("*")
                  if p.is_file() and p.suffix in (".json", ".tfevents") and "mltrace_done" not in p.parts)


def _fuzz_trial(source: Path, pristine: Pristine | None, scratch: Path, examples: int, label: str) -> None:
    files = [p.relative_to(source) for p in _trial_files(source)]
    seeds = {f: (source / f).read_bytes() for f in files}
    names = sorted(create_trial(str(source)).tensor_names())

    @fuzz_settings(examples)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(files))
        strategy = damaged([seeds[target]], json_seeds=target.suffix == ".json")
        run = Path(tempfile.mkdtemp(dir=scratch)) / "run"
        try:
            shutil.copytree(source, run)
            (run / target).write_bytes(data.draw(strategy))
            shown = data.draw(st.sampled_from(names))
            INPUTS[f"{label} trial dirs"] += 1
            with logged_warnings() as logged:
                _read_everything(run, pristine, logged, shown)
        finally:
            shutil.rmtree(run.parent, ignore_errors=True)

    check()


@pytest.mark.timeout(300)
def test_trial_with_one_damaged_file(pristine: Pristine, scratch: Path) -> None:
    """mltrace-written trials: the index CRC lets no damaged payload through as a value."""
    _fuzz_trial(pristine.path, pristine, scratch, 120, "mltrace")


@pytest.mark.timeout(300)
def test_smdebug_trial_with_one_damaged_file(scratch: Path) -> None:
    """smdebug-written trials (no crc32c in the index, fixed data CRCs): a flipped bit in tensor
    bytes cannot be detected there, so only the error behaviour is checked, not the values."""
    _fuzz_trial(SMDEBUG_RUN, None, scratch, 40, "smdebug")
