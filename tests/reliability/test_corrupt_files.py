"""Damaged trial files: a clear error or a skipped step with a warning naming the file, never a
wrong value and never a hang (the "Reliability" issue).

Each test copies one real trial written by the PyTorch hook (tests/support/damaged_trials.py: TRAIN steps
0-2, EVAL step 3; weights, gradients, loss, stored mean/l2 reductions, save_tensor values),
damages one file on disk, and reads the copy through create_trial, steps, value, values,
reduction_value, ``mltrace info`` and the TensorBoard panels. The good steps beside a bad one
must still read exactly what training computed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mltrace import cli
from mltrace.exceptions import (
    CorruptRecordError,
    MissingCollectionFiles,
    MltraceTypeError,
    MltraceValueError,
    StepUnavailable,
    TensorUnavailableForStep,
)
from mltrace.format import _wire as w
from mltrace.format.tensors import encode_tensor
from mltrace.reductions import compute
from mltrace.rules.results import RuleResult, read_results
from mltrace.trials import Trial
from mltrace_tb import rules_view, views
from tests.support.damaged_trials import (
    GRAD,
    INTS,
    LOSS,
    TEXT,
    WEIGHT,
    Pristine,
    assert_same_value,
    collections_file,
    copy_trial,
    entry,
    events_file,
    flip_byte,
    index_file,
    open_trial,
    read_index,
    rewrite_step,
    write_index,
)

SMDEBUG_RUN = Path(__file__).resolve().parents[1] / "golden" / "smdebug_1.0.34" / "pytorch_run"
BAD = 1  # the global step whose files the tests damage
EVENTS_NAME = f"{BAD:012d}_worker_0.tfevents"
INDEX_NAME = f"{BAD:012d}_worker_0.json"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def run(pristine: Pristine, tmp_path: Path) -> Path:
    """A fresh copy of the pristine trial, to damage."""
    return copy_trial(pristine, tmp_path / "run")


def assert_good_steps(trial: Trial, pristine: Pristine, bad: int | None = BAD) -> None:
    """Every value of every step but ``bad`` reads exactly as in the undamaged trial."""
    for name, by_step in pristine.values.items():
        for step, expected in by_step.items():
            if step != bad:
                assert_same_value(trial.tensor(name).value(step), expected, f"{name} at {step}")
                for key, red in pristine.reductions[name][step].items():
                    assert_same_value(trial.tensor(name).reduction_value(step, key[0]), red)


def info(run: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``mltrace info`` in this process: (exit code, stdout, stderr)."""
    code = cli.main(["info", str(run), "--timeout", "0"])
    out = capsys.readouterr()
    return code, out.out, out.err


def records_after(run: Path, cut: int) -> set[str]:
    """Names of step BAD's records that do not lie wholly before byte ``cut``."""
    return {e["tensorname"] for e in read_index(run, BAD)["tensor_payload"]
            if e["start_idx"] + e["length"] > cut}


def test_the_pristine_trial_holds_what_training_computed(pristine: Pristine) -> None:
    for name, by_step in pristine.captured.values.items():
        for step, expected in by_step.items():
            assert np.array_equal(pristine.values[name][step], expected), (name, step)
    for step in pristine.steps:
        assert pristine.values[INTS][step].tolist() == [[(step + 1) * i for i in (0, 1, 2)],
                                                        [(step + 1) * i for i in (3, 4, 5)]]
        assert pristine.values[TEXT][step].tolist() == ["start", f"step {step}"]
        mean = pristine.reductions[WEIGHT][step][("mean", False)]
        assert mean == pytest.approx(compute("mean", pristine.values[WEIGHT][step]))


# -- events files -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["header", "payload", "footer"])
def test_truncated_events_file(run: Path, pristine: Pristine, where: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    weight = entry(read_index(run, BAD), WEIGHT)
    cut = weight["start_idx"] + {"header": 5, "payload": 40, "footer": weight["length"] - 2}[where]
    path = events_file(run, BAD)
    path.write_bytes(path.read_bytes()[:cut])
    trial = open_trial(run)
    assert trial.steps() == pristine.steps  # the index is whole: the step is listed
    damaged = records_after(run, cut)
    assert WEIGHT in damaged
    for name in trial.tensor_names(step=BAD):
        tensor = trial.tensor(name)
        if name in damaged or f"smdebug/reductions/mean/{name}" in damaged:
            with pytest.raises(CorruptRecordError, match=EVENTS_NAME) as exc:
                tensor.value(BAD) if name in damaged else tensor.reduction_value(BAD, "mean")
            assert "delete or restore it" in str(exc.value)
        else:
            assert_same_value(tensor.value(BAD), pristine.values[name][BAD], name)
    with pytest.raises(CorruptRecordError, match=EVENTS_NAME):
        trial.tensor(WEIGHT).values()
    reduced = next(n for n in damaged if n.startswith("smdebug/reductions/l2/"))
    with pytest.raises(CorruptRecordError, match=EVENTS_NAME):
        trial.tensor(reduced.split("/", 3)[3]).reduction_value(BAD, "l2")
    assert_good_steps(trial, pristine)
    code, out, _ = info(run, capsys)
    assert code == 0 and "TRAIN: 3 steps (0..2)" in out


def test_zero_length_events_file(run: Path, pristine: Pristine) -> None:
    events_file(run, BAD).write_bytes(b"")
    trial = open_trial(run)
    for name in trial.tensor_names(step=BAD):
        if BAD in pristine.values[name]:
            with pytest.raises(CorruptRecordError, match=rf"{EVENTS_NAME}.*truncated record \(0 bytes"):
                trial.tensor(name).value(BAD)
    assert_good_steps(trial, pristine)


def test_flipped_payload_bytes_are_caught_by_the_index_crc(run: Path, pristine: Pristine) -> None:
    for e in read_index(run, BAD)["tensor_payload"]:  # one flipped bit in every record's payload
        flip_byte(events_file(run, BAD), e["start_idx"] + 12 + (e["length"] - 16) // 2)
    trial = open_trial(run)
    for name in trial.tensor_names(step=BAD):
        tensor = trial.tensor(name)
        if BAD in pristine.values[name]:
            with pytest.raises(CorruptRecordError, match=f"{EVENTS_NAME}.*differs from the index"):
                tensor.value(BAD)
        for key in pristine.reductions[name][BAD]:
            with pytest.raises(CorruptRecordError, match="differs from the index"):
                tensor.reduction_value(BAD, key[0])
    with pytest.raises(CorruptRecordError, match=EVENTS_NAME):
        trial.tensor(GRAD).values()
    assert_good_steps(trial, pristine)


@pytest.mark.parametrize(("offset", "problem"), [(3, "length CRC mismatch"), (9, "length CRC mismatch"),
                                                 (-1, "data CRC mismatch")])
def test_flipped_header_or_footer_byte(run: Path, pristine: Pristine, offset: int, problem: str) -> None:
    weight = entry(read_index(run, BAD), WEIGHT)
    at = weight["start_idx"] + (offset if offset >= 0 else weight["length"] + offset)
    flip_byte(events_file(run, BAD), at)
    trial = open_trial(run)
    with pytest.raises(CorruptRecordError, match=f"{EVENTS_NAME} at byte {weight['start_idx']}: {problem}"):
        trial.tensor(WEIGHT).value(BAD)
    assert_good_steps(trial, pristine)


def test_unknown_dtype_names_the_file_and_the_fix(run: Path, pristine: Pristine) -> None:
    """A record from a newer writer (DataType 99): a clear error for that record only."""
    proto = encode_tensor(WEIGHT, pristine.values[WEIGHT][BAD])
    assert proto.startswith(w.varint_field(1, 1))  # DT_FLOAT first, as protobuf orders fields
    value = w.len_field(1, WEIGHT.encode()) + w.len_field(8, w.varint_field(1, 99) + proto[2:])
    rewrite_step(run, BAD, {WEIGHT: w.varint_field(2, BAD) + w.len_field(5, w.len_field(1, value))})
    trial = open_trial(run)
    with pytest.raises(MltraceTypeError, match=f"{EVENTS_NAME}.*DataType 99.*upgrade mltrace"):
        trial.tensor(WEIGHT).value(BAD)
    for name in trial.tensor_names(step=BAD):
        if name != WEIGHT and BAD in pristine.values[name]:
            assert_same_value(trial.tensor(name).value(BAD), pristine.values[name][BAD], name)
    assert_good_steps(trial, pristine)
    shown = views.histograms(trial, WEIGHT, trial.mode(BAD), None, 10, None)
    assert BAD not in shown["steps"] and [d["step"] for d in shown["damaged"]] == [BAD]


# -- index files --------------------------------------------------------------------------------


GARBAGE_INDEXES = {
    "empty": b"",
    "not JSON": b"{not json",
    "binary": b"\xff\xfe\x00garbage",
    "a list": b"[]",
    "null": b"null",
    "no meta": b'{"meta": {}, "tensor_payload": []}',
    "deeply nested": b"[" * 100_000,
}


def _edited_index(field: str, value: object) -> Callable[[dict], dict]:
    """An edit of step BAD's index: one field of WEIGHT's entry, or of meta."""

    def edit(doc: dict) -> dict:
        if field == "event_file_name":
            doc["meta"][field] = value
        else:
            entry(doc, WEIGHT)[field] = value
        return doc
    return edit


INDEX_EDITS = {
    "negative start_idx": _edited_index("start_idx", -5),
    "infinite start_idx": _edited_index("start_idx", float("inf")),
    "float length": _edited_index("length", 275.5),
    "length under 16": _edited_index("length", 3),
    "64-bit crc": _edited_index("crc32c", 1 << 40),
    "name not a string": _edited_index("tensorname", {"a": 1}),
    "events file outside the trial": _edited_index("event_file_name", "../../elsewhere.tfevents"),
    "lone surrogate in a name": _edited_index("tensorname", "\udc80"),
}


@pytest.mark.parametrize("damage", list(GARBAGE_INDEXES) + list(INDEX_EDITS))
def test_damaged_index_skips_its_step_with_a_warning(run: Path, pristine: Pristine, damage: str,
                                                     caplog: pytest.LogCaptureFixture,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    if damage in GARBAGE_INDEXES:
        index_file(run, BAD).write_bytes(GARBAGE_INDEXES[damage])
    else:
        write_index(run, BAD, INDEX_EDITS[damage](read_index(run, BAD)))
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        trial = open_trial(run)
    assert trial.steps() == [s for s in pristine.steps if s != BAD]
    assert trial.skipped_files == [f"index/000000000/{INDEX_NAME}"]
    warning = next(r.getMessage() for r in caplog.records if INDEX_NAME in r.getMessage())
    assert "delete or restore it" in warning or "neither" in warning
    with pytest.raises(StepUnavailable):
        trial.tensor(WEIGHT).value(BAD)
    assert_good_steps(trial, pristine)
    code, out, _ = info(run, capsys)
    assert code == 0 and f"skipped (damaged) index files: index/000000000/{INDEX_NAME}" in out


def test_index_pointing_past_the_end_of_the_events_file(run: Path, pristine: Pristine) -> None:
    doc = read_index(run, BAD)
    size = events_file(run, BAD).stat().st_size
    entry(doc, WEIGHT)["start_idx"] = size + 100
    # and another record (not the last) whose length would need an exabyte
    first = next(e for e in doc["tensor_payload"][:-1] if e["tensorname"] != WEIGHT)
    first["length"] = 1 << 60
    write_index(run, BAD, doc)
    trial = open_trial(run)
    with pytest.raises(CorruptRecordError, match=rf"{EVENTS_NAME} at byte {size + 100}: truncated record \(0 bytes"):
        trial.tensor(WEIGHT).value(BAD)
    base = first["tensorname"].split("/", 3)[3] if first["tensorname"].startswith("smdebug/") else None
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match=f"{EVENTS_NAME}.*header says"):
            if base is None:
                trial.tensor(first["tensorname"]).value(BAD)
            else:
                trial.tensor(base).reduction_value(BAD, first["tensorname"].split("/")[2])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the read stopped at the end of the file
    assert_good_steps(trial, pristine)


@pytest.mark.parametrize("delta", [-1, 1, 16, -16])
def test_index_length_that_does_not_match_the_record(run: Path, pristine: Pristine, delta: int) -> None:
    doc = read_index(run, BAD)
    entry(doc, WEIGHT)["length"] += delta
    write_index(run, BAD, doc)
    trial = open_trial(run)
    with pytest.raises(CorruptRecordError, match=EVENTS_NAME):
        trial.tensor(WEIGHT).value(BAD)
    assert_good_steps(trial, pristine)


@pytest.mark.parametrize("how", ["renamed in the index", "deleted"])
def test_index_naming_a_missing_events_file(run: Path, pristine: Pristine, how: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    if how == "deleted":
        os.remove(events_file(run, BAD))
        missing = EVENTS_NAME
    else:
        doc = read_index(run, BAD)
        doc["meta"]["event_file_name"] = missing = "events/000000000001/gone.tfevents"
        write_index(run, BAD, doc)
    trial = open_trial(run)
    assert trial.steps() == pristine.steps
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        with pytest.raises(TensorUnavailableForStep):
            trial.tensor(WEIGHT).value(BAD)
        with pytest.raises(TensorUnavailableForStep):
            trial.tensor(WEIGHT).values()
    assert any(missing in r.getMessage() and "missing" in r.getMessage() for r in caplog.records)
    assert_good_steps(trial, pristine)


def test_duplicate_index_entries(run: Path, pristine: Pristine) -> None:
    doc = read_index(run, BAD)
    doc["tensor_payload"].append(dict(entry(doc, WEIGHT)))  # the same entry twice: harmless
    write_index(run, BAD, doc)
    assert_same_value(open_trial(run).tensor(WEIGHT).value(BAD), pristine.values[WEIGHT][BAD])

    # A second WEIGHT entry that points at another tensor's record, whose own CRC matches: the
    # record's tag says whose it is, so the other tensor's value is never returned as WEIGHT's.
    other = dict(entry(doc, "Sequential_2.weight"), tensorname=WEIGHT)
    doc["tensor_payload"].append(other)
    write_index(run, BAD, doc)
    trial = open_trial(run)
    with pytest.raises(CorruptRecordError, match=f"{EVENTS_NAME}.*holds tensor 'Sequential_2.weight'"):
        trial.tensor(WEIGHT).value(BAD)
    assert_same_value(trial.tensor("Sequential_2.weight").value(BAD), pristine.values["Sequential_2.weight"][BAD])
    assert_good_steps(trial, pristine)


def test_events_file_without_its_index(run: Path, pristine: Pristine,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    os.remove(index_file(run, BAD))
    trial = open_trial(run)
    assert trial.steps() == [s for s in pristine.steps if s != BAD]  # index-driven, as smdebug
    with pytest.raises(StepUnavailable):
        trial.tensor(WEIGHT).value(BAD)
    assert_good_steps(trial, pristine)
    code, out, _ = info(run, capsys)  # the step is not lost silently
    assert code == 0 and f"events files without an index file (not read; the index was lost): " \
                         f"events/{BAD:012d}/{EVENTS_NAME}" in out


# -- collections, stray files, rule results -------------------------------------------------------


def test_missing_collections_file(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.remove(collections_file(run))
    with pytest.raises(MissingCollectionFiles, match="has index files but no collections") as exc:
        open_trial(run)
    assert exc.value.has_steps and "restore it" in str(exc.value) and str(run) in str(exc.value)
    code, _, err = info(run, capsys)
    assert code == 2 and err.startswith("mltrace: error: trial") and "restore it" in err


@pytest.mark.parametrize("content", [b"", b"\x00\xff", b'{"collections": 3}', b"[" * 100_000,
                                     b'{"collections": {}, "_meta": {"num_workers": 1e400}}'])
def test_damaged_collections_file_names_the_file(run: Path, content: bytes) -> None:
    collections_file(run).write_bytes(content)
    with pytest.raises(MltraceValueError, match="worker_0_collections.json.*restore it"):
        open_trial(run)


def test_stray_files_are_ignored(run: Path, pristine: Pristine, capsys: pytest.CaptureFixture[str]) -> None:
    strays = ["README.txt", ".DS_Store", "index/000000000/notes.txt", "index/README",
              f"index/000000000/{INDEX_NAME}.bak", f"index/000000000/.{INDEX_NAME}.123.tmp",
              f"events/{BAD:012d}/partial.tmp", "events/stray.bin", "collections/000000000/README.md",
              "collections/notes.json", "mltrace_rules/notes.txt"]
    for stray in strays:
        (run / stray).parent.mkdir(parents=True, exist_ok=True)
        (run / stray).write_bytes(b"\x00 not trial data")
    (run / "index" / "000000001").mkdir()
    (run / "events" / "999999999999").mkdir()
    trial = open_trial(run)
    assert trial.steps() == pristine.steps and trial.skipped_files == []
    assert trial.workers() == ["worker_0"]
    assert_good_steps(trial, pristine, bad=None)
    code, out, _ = info(run, capsys)
    assert code == 0 and "skipped" not in out and "without an index" not in out


def test_damaged_rule_results_are_skipped(run: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = RuleResult("VanishingGradient", "run", {}, status="NoIssuesFound", evaluated_steps=3)
    folder = run / "mltrace_rules"
    folder.mkdir()
    (folder / "good.json").write_text(good.to_json())
    (folder / "garbage.json").write_bytes(b"\xff{")
    (folder / "wrong_types.json").write_text(json.dumps({**json.loads(good.to_json()), "started": "yesterday"}))
    (folder / "nested.json").write_bytes(b"[" * 100_000)
    trial = open_trial(run)
    with caplog.at_level(logging.WARNING, logger="mltrace"):
        results = read_results(trial.storage)
    assert [r.run_id for r in results] == [good.run_id]
    for name in ("garbage.json", "wrong_types.json", "nested.json"):
        assert any(name in r.getMessage() for r in caplog.records), name
    assert [r["rule"] for r in rules_view.rules(trial, None)["rules"]] == ["VanishingGradient"]


# -- the TensorBoard panels and smdebug-written trials ------------------------------------------


def test_tensorboard_series_leaves_a_damaged_step_out(run: Path, pristine: Pristine) -> None:
    loss = entry(read_index(run, BAD), LOSS)
    flip_byte(events_file(run, BAD), loss["start_idx"] + loss["length"] - 6)  # the float's bytes
    trial = open_trial(run)
    cache = views.SeriesCache()
    series = views.series(trial, LOSS, None, None, False, cache, None)["modes"]["TRAIN"]
    assert series["steps"] == [0, 2] and [d["step"] for d in series["damaged"]] == [BAD]
    assert EVENTS_NAME in series["damaged"][0]["error"]
    assert series["values"]["value"] == [float(pristine.values[LOSS][s]) for s in (0, 2)]
    again = views.series(trial, LOSS, None, None, False, cache, None)["modes"]["TRAIN"]
    assert again["damaged"] == series["damaged"]  # not cached as "no data"


@pytest.fixture
def smdebug_run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SMDEBUG_RUN, tmp_path / "smdebug_run"))


def _smdebug_entry(run: Path, step: int, name: str) -> dict:
    return entry(json.loads(index_file(run, step).read_text()), name)


@pytest.mark.parametrize(("where", "problem"), [("header", "length CRC mismatch"), ("footer", "data CRC"),
                                                ("name", "holds tensor 'Net_fc1.weighu'")])
def test_smdebug_trial_without_index_crc_still_catches_damaged_framing(
        smdebug_run: Path, where: str, problem: str) -> None:
    """smdebug's index has no crc32c and its records carry a fixed data CRC; the length CRC, the
    fixed footer and the record's own tag still catch damage to the framing and to the name."""
    name = "Net_fc1.weight"
    e = _smdebug_entry(smdebug_run, 0, name)
    path = events_file(smdebug_run, 0)
    record = path.read_bytes()[e["start_idx"]:e["start_idx"] + e["length"]]
    offset = {"header": 2, "footer": e["length"] - 2, "name": record.index(name.encode()) + len(name) - 1}[where]
    flip_byte(path, e["start_idx"] + offset)
    trial = open_trial(smdebug_run)
    with pytest.raises(CorruptRecordError, match=f"000000000000_worker_0.tfevents.*{problem}"):
        trial.tensor(name).value(0)
    untouched = open_trial(SMDEBUG_RUN)
    for step in trial.tensor(name).steps()[1:]:
        assert_same_value(trial.tensor(name).value(step), untouched.tensor(name).value(step))


def _tensor_byte(run: Path, pristine: Pristine) -> int:
    """The file offset of a byte inside WEIGHT's float data at step BAD."""
    weight = entry(read_index(run, BAD), WEIGHT)
    data = events_file(run, BAD).read_bytes()
    content = pristine.values[WEIGHT][BAD].tobytes()
    return data.index(content, weight["start_idx"]) + len(content) // 2


def test_smdebug_style_index_with_real_record_crcs(run: Path, pristine: Pristine) -> None:
    """An index without crc32c (as smdebug writes) over records whose footer is the real payload
    CRC (as TensorBoard writes): the record CRC catches a flipped payload byte."""
    rewrite_step(run, BAD, {}, real_crc=True, index_crc=False)
    assert "crc32c" not in read_index(run, BAD)["tensor_payload"][0]
    trial = open_trial(run)
    assert_same_value(trial.tensor(WEIGHT).value(BAD), pristine.values[WEIGHT][BAD])
    flip_byte(events_file(run, BAD), _tensor_byte(run, pristine))
    with pytest.raises(CorruptRecordError, match=f"{EVENTS_NAME}.*data CRC mismatch"):
        open_trial(run).tensor(WEIGHT).value(BAD)


def test_smdebug_format_cannot_see_a_flipped_tensor_byte(run: Path, pristine: Pristine) -> None:
    """The limit of smdebug's own format, kept here so that it stays known: with neither an index
    crc32c nor a real record CRC, a flipped bit inside tensor bytes reads as another number.
    mltrace's writer always puts the crc32c in the index, which closes this."""
    rewrite_step(run, BAD, {}, index_crc=False)
    flip_byte(events_file(run, BAD), _tensor_byte(run, pristine))
    value = open_trial(run).tensor(WEIGHT).value(BAD)
    assert value.shape == pristine.values[WEIGHT][BAD].shape
    assert not np.array_equal(value, pristine.values[WEIGHT][BAD])
