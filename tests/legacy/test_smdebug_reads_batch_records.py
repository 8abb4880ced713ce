"""Real smdebug 1.0.34 reads the records of the batch encoder (mltrace.format.event_batch): a
step's reductions, encoded together, and raw tensors of every dtype the format holds.

The trials are those of tests/support/golden_trials.py (whose bytes tests/format/
test_event_batch.py holds to the record-by-record writer's), written here by the current code:
smdebug must list the same tensors and steps as mltrace's reader and read the same values.
"""

from __future__ import annotations

import numpy as np
import pytest
from smdebug.core.modes import ModeKeys as SmdModeKeys
from smdebug.trials import create_trial as smd_create_trial

from mltrace.collections import CollectionManager
from mltrace.format import paths
from mltrace.trials import create_trial as ml_create_trial
from tests.support import golden_trials

#: the dtypes smdebug 1.0.34's reader knows (smdebug.core.tfevent.event_file_reader.as_dtype)
SMDEBUG_DTYPES = ("bool", "int8", "int32", "int64", "uint8", "float16", "float32", "float64",
                  "complex128")
#: what it reads them as where that is another dtype (the same bits)
SMDEBUG_READS_AS = {"int8": "uint8"}


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_records")
    golden_trials.write_hook_trial(str(root / "hook"))
    golden_trials.write_writer_trial(str(root / "writer"))
    # the writer alone writes neither collections nor an end marker, which smdebug's reader needs
    manager = CollectionManager()
    manager.get("values").include("values/")
    collections = root / "writer" / paths.collections_file_key("worker_0")
    collections.parent.mkdir(parents=True)
    collections.write_text(manager.to_json())
    (root / "writer" / "training_job_end.ts").write_text("")
    return root


def test_smdebug_reads_every_reduction_of_the_hook_trial(trials):
    out_dir = str(trials / "hook")
    st, mt = smd_create_trial(out_dir), ml_create_trial(out_dir)
    assert sorted(st.tensor_names()) == sorted(mt.tensor_names())
    compared = 0
    for name in mt.tensor_names(collection="weights") + mt.tensor_names(collection="gradients"):
        for step in mt.tensor(name).steps():
            ours = mt.tensor(name).reduction_values(step)
            theirs = st.tensor(name).reduction_values(step)
            assert ours, name
            for (reduction, abs_), value in ours.items():
                if reduction in ("median", "nan_count", "inf_count", "zero_fraction"):
                    continue  # mltrace's own reductions: smdebug's reader has no name for them
                assert (reduction, abs_) in theirs, (name, reduction, abs_)
                np.testing.assert_array_equal(theirs[(reduction, abs_)], value)
                compared += 1
    assert compared > 100
    losses = mt.tensor_names(collection="losses")
    assert losses and st.tensor(losses[0]).steps() == mt.tensor(losses[0]).steps()


def test_smdebug_reads_raw_values_of_every_dtype(trials):
    out_dir = str(trials / "writer")
    st, mt = smd_create_trial(out_dir), ml_create_trial(out_dir)
    read_as: dict[str, str] = {}
    for name, value in golden_trials.arrays():
        if value.size == 0 or value.dtype.name not in SMDEBUG_DTYPES or "bfloat16" in name:
            continue  # what smdebug's reader has no dtype for (docs/format.md); empty tensors
        for step, mode in ((0, SmdModeKeys.TRAIN), (1, SmdModeKeys.EVAL)):
            theirs = np.asarray(st.tensor(name).value(step, mode=mode))
            native = value.dtype.newbyteorder("=")  # a big-endian array is written little-endian
            if theirs.dtype != native:  # smdebug's own dtype table (see docs/format.md)
                read_as[str(native)] = str(theirs.dtype)
                theirs = theirs.view(native)
            np.testing.assert_array_equal(theirs, value, err_msg=name)
            np.testing.assert_array_equal(mt.tensor(name).value(step, mode=mode.name), value)
    assert read_as == SMDEBUG_READS_AS
