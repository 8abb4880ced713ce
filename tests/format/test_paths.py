"""The trial layout: file names exactly as smdebug 1.0.34 writes and parses them."""

from __future__ import annotations

import pytest

from mltrace.format import paths


def test_event_file_key():
    assert (
        paths.event_file_key(10, "worker_0") == "events/000000000010/000000000010_worker_0.tfevents"
    )
    assert (
        paths.event_file_key(0, "worker_3") == "events/000000000000/000000000000_worker_3.tfevents"
    )


@pytest.mark.parametrize(
    ("step", "key"),
    [
        (0, "index/000000000/000000000000_worker_0.json"),
        (999, "index/000000000/000000000999_worker_0.json"),
        (1000, "index/000000001/000000001000_worker_0.json"),
        (1500, "index/000000001/000000001500_worker_0.json"),
        (123456789, "index/000123456/000123456789_worker_0.json"),
    ],
)
def test_index_file_key_buckets_1000_steps(step, key):
    assert paths.index_file_key(step, "worker_0") == key
    assert key.startswith(paths.index_prefix(step) + "/")


def test_collections_file_key():
    assert (
        paths.collections_file_key("worker_0") == "collections/000000000/worker_0_collections.json"
    )


def test_constant_names():
    assert paths.END_OF_JOB_MARKER == "training_job_end.ts"
    assert paths.DEFAULT_WORKER_NAME == "worker_0"
    assert paths.TENSORBOARD_DIR == "tensorboard"


@pytest.mark.parametrize("step", [0, 7, 999, 1000, 1500, 10**11])
@pytest.mark.parametrize("worker", ["worker_0", "worker_12", "chief_0", "w-1.a"])
def test_parse_index_key_round_trip(step, worker):
    assert paths.parse_index_key(paths.index_file_key(step, worker)) == (step, worker)


def test_parse_index_key_worker_may_hold_underscores():
    # TF MirroredStrategy workers are serialized device names full of '_' (smdebug 1.9).
    worker = "_job-worker_replica-0_task-0_device-GPU-0"
    assert paths.parse_index_key(paths.index_file_key(3, worker)) == (3, worker)


@pytest.mark.parametrize(
    "key",
    [
        "index/000000001/000000001500_worker_0.json.tmp",
        "index/000000001/000000001500_worker_0.csv",
        "index/000000001/1500_worker_0.json",
        "index/1/000000001500_worker_0.json",
        "events/000000001500/000000001500_worker_0.tfevents",
        "prefix/index/000000001/000000001500_worker_0.json",
        "index/000000001/000000001500_.json",
        "index/000000001/000000001500_worker_0.json\n",
    ],
)
def test_parse_index_key_rejects_other_keys(key):
    assert paths.parse_index_key(key) is None


def test_parse_collections_key():
    assert paths.parse_collections_key(paths.collections_file_key("worker_2")) == "worker_2"
    assert paths.parse_collections_key("collections/000000000/worker_2.json") is None


@pytest.mark.parametrize(
    "worker", ["worker_0", "chief_0", "host-1.rank_3", "_job-worker_replica-0_task-0_device-GPU-0"]
)
def test_good_worker_names_are_accepted(worker):
    assert paths.check_worker_name(worker) == worker


@pytest.mark.parametrize(
    "worker",
    ["", ".", "..", "a/b", "../x", "a\\b", "a b", "wörker", "w:0", "worker_0\n", "\nworker_0"],
)
def test_bad_worker_names_are_rejected(worker):
    with pytest.raises(ValueError) as info:
        paths.check_worker_name(worker)
    assert repr(worker) in str(info.value)
    assert "worker_0" in str(info.value)  # the message shows a good name
