"""Index files: smdebug's JSON (keys, order, separators) plus mltrace's crc32c field."""

from __future__ import annotations

import json

import pytest

from mltrace.exceptions import IndexReaderException
from mltrace.format.index import IndexEntry, ShapeEntry, StepIndex, decode_index, encode_index
from mltrace.modes import ModeKeys

WHERE = "index/000000000/000000000010_worker_0.json"
EVENTS = "events/000000000010/000000000010_worker_0.tfevents"


def make_index(**overrides) -> StepIndex:
    fields = {
        "mode": ModeKeys.TRAIN,
        "mode_step": 10,
        "event_file_name": EVENTS,
        "tensors": [
            IndexEntry("Net_fc1.weight", 0, 1234),
            IndexEntry("smdebug/reductions/mean/Net_fc1.weight", 1234, 147),
        ],
        "shapes": [ShapeEntry("Net_fc1.weight", (10, 784), "Net_fc1.weight")],
    }
    fields.update(overrides)
    return StepIndex(**fields)


def test_encode_index_is_byte_identical_to_smdebug():
    # smdebug's writer: json.dumps with default separators, keys in this order.
    expected = (
        '{"meta": {"mode": "TRAIN", "mode_step": 10, "event_file_name": '
        '"events/000000000010/000000000010_worker_0.tfevents"}, '
        '"tensor_payload": [{"tensorname": "Net_fc1.weight", "start_idx": 0, "length": 1234}, '
        '{"tensorname": "smdebug/reductions/mean/Net_fc1.weight", '
        '"start_idx": 1234, "length": 147}], '
        '"shape_payload": [{"tensorname": "Net_fc1.weight", "originalname": "Net_fc1.weight", '
        '"shape": [10, 784]}]}'
    )
    assert encode_index(make_index()) == expected.encode()


def test_an_index_of_a_steps_records_is_that_of_their_entries():
    """encode_index(index, records): the entries of the events file's records, offsets counted
    from its start, the same bytes as the IndexEntry objects of those records."""
    from mltrace.format.event_batch import EncodedRecords

    records = EncodedRecords(parts=[], names=["a", "b/\u00e9", "c"], lengths=[30, 41, 16], crcs=[7, 0, 4294967295])
    entries = [IndexEntry("a", 0, 30, 7), IndexEntry("b/\u00e9", 30, 41, 0), IndexEntry("c", 71, 16, 4294967295)]
    from_records = encode_index(make_index(tensors=[]), records)
    assert from_records == encode_index(make_index(tensors=entries))
    assert decode_index(from_records, WHERE).tensors == entries


def test_encode_index_uses_json_dumps_default_separators():
    data = encode_index(make_index())
    assert data == json.dumps(json.loads(data)).encode()
    assert b'": ' in data and b", " in data


def test_index_keys_are_smdebugs():
    doc = json.loads(encode_index(make_index()))
    assert list(doc) == ["meta", "tensor_payload", "shape_payload"]
    assert list(doc["meta"]) == ["mode", "mode_step", "event_file_name"]
    assert list(doc["tensor_payload"][0]) == ["tensorname", "start_idx", "length"]
    assert list(doc["shape_payload"][0]) == ["tensorname", "originalname", "shape"]


@pytest.mark.parametrize("mode", list(ModeKeys))
def test_mode_is_written_by_name(mode):
    doc = json.loads(encode_index(make_index(mode=mode)))
    assert doc["meta"]["mode"] == mode.name
    assert decode_index(encode_index(make_index(mode=mode)), WHERE).mode is mode


def test_crc32c_extra_field_round_trips():
    index = make_index(
        tensors=[IndexEntry("a", 0, 30, crc32c=0xE3069283), IndexEntry("b", 30, 40, crc32c=0)]
    )
    data = encode_index(index)
    entries = json.loads(data)["tensor_payload"]
    assert [e["crc32c"] for e in entries] == [0xE3069283, 0]
    assert list(entries[0]) == ["tensorname", "start_idx", "length", "crc32c"]
    assert decode_index(data, WHERE) == index


def test_entry_without_crc_has_no_crc_key_and_reads_as_none():
    data = encode_index(make_index(tensors=[IndexEntry("a", 0, 30)]))
    assert "crc32c" not in json.loads(data)["tensor_payload"][0]
    assert decode_index(data, WHERE).tensors == [IndexEntry("a", 0, 30, None)]


def test_full_round_trip():
    index = make_index()
    assert decode_index(encode_index(index), WHERE) == index


def test_shape_only_index_has_no_event_file_name():
    index = make_index(event_file_name=None, tensors=[], shapes=[ShapeEntry("w", (3, 0), None)])
    doc = json.loads(encode_index(index))
    assert doc["meta"] == {"mode": "TRAIN", "mode_step": 10}
    assert doc["shape_payload"] == [{"tensorname": "w", "originalname": "w", "shape": [3, 0]}]
    decoded = decode_index(encode_index(index), WHERE)
    assert decoded.event_file_name is None
    assert decoded.shapes == [ShapeEntry("w", (3, 0), "w")]


def test_reads_smdebugs_own_index_without_crc():
    data = json.dumps(
        {
            "meta": {"mode": "EVAL", "mode_step": 2, "event_file_name": EVENTS},
            "tensor_payload": [{"tensorname": "loss", "start_idx": 0, "length": 120}],
            "shape_payload": [],
        }
    ).encode()
    decoded = decode_index(data, WHERE)
    assert decoded.mode is ModeKeys.EVAL
    assert decoded.mode_step == 2
    assert decoded.tensors == [IndexEntry("loss", 0, 120, None)]


def test_reader_ignores_unknown_entry_keys():
    data = json.dumps(
        {
            "meta": {"mode": "TRAIN", "mode_step": 1, "event_file_name": EVENTS, "extra": 1},
            "tensor_payload": [{"tensorname": "a", "start_idx": 0, "length": 20, "future": "x"}],
        }
    ).encode()
    assert decode_index(data, WHERE).tensors == [IndexEntry("a", 0, 20)]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"   \n",
        b"garbage",
        b'{"meta": {"mode": "TRAIN"',
        b"\xff\xfe\x00",
    ],
    ids=["empty", "blank", "garbage", "cut-short", "binary"],
)
def test_empty_or_garbage_index_names_the_file(data):
    with pytest.raises(IndexReaderException) as info:
        decode_index(data, WHERE)
    assert WHERE in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "doc",
    [
        [],
        None,
        "meta",
        {},
        {"meta": {}, "tensor_payload": []},
        {"meta": {"mode": "BOGUS", "mode_step": 1}, "tensor_payload": []},
        {"meta": {"mode": "TRAIN"}, "tensor_payload": []},
        {"meta": {"mode": "TRAIN", "mode_step": "x"}, "tensor_payload": []},
        {"meta": {"mode": "TRAIN", "mode_step": 1}},
        {"meta": {"mode": "TRAIN", "mode_step": 1}, "tensor_payload": 5},
        {"meta": {"mode": "TRAIN", "mode_step": 1}, "tensor_payload": "abc"},
        {
            "meta": {"mode": "TRAIN", "mode_step": 1, "event_file_name": EVENTS},
            "tensor_payload": [{"tensorname": "a"}],
        },
        {
            "meta": {"mode": "TRAIN", "mode_step": 1, "event_file_name": EVENTS},
            "tensor_payload": [{"tensorname": "a", "start_idx": 0, "length": 3, "crc32c": "zz"}],
        },
        {
            "meta": {"mode": "TRAIN", "mode_step": 1},
            "tensor_payload": [{"tensorname": "a", "start_idx": 0, "length": 3}],
        },
        {"meta": {"mode": "TRAIN", "mode_step": 1}, "shape_payload": [{"tensorname": "a"}]},
        {
            "meta": {"mode": "TRAIN", "mode_step": 1},
            "shape_payload": [{"tensorname": "a", "shape": 3}],
        },
    ],
)
def test_wrongly_shaped_index_names_the_file(doc):
    with pytest.raises(IndexReaderException) as info:
        decode_index(json.dumps(doc).encode(), WHERE)
    assert WHERE in str(info.value)


@pytest.mark.parametrize("name", ["fc1.weight", 'odd "quoted" \\ name', "größe/ß", "tab\tand\nnewline",
                                  "emoji_\U0001f600", "ctrl\x01"])
def test_encode_index_equals_json_dumps_of_the_dict_for_any_name(name):
    # encode_index builds the JSON from each name's cached encoding; json.dumps of the dict (as
    # smdebug's writer builds it) is the reference, for names json must escape.
    index = make_index(tensors=[IndexEntry(name, 0, 120, 7), IndexEntry(name + "2", 120, 99)],
                       shapes=[ShapeEntry(name, (3, 0), name)], mode=ModeKeys.EVAL, mode_step=2**40)
    reference = {
        "meta": {"mode": "EVAL", "mode_step": 2**40, "event_file_name": EVENTS},
        "tensor_payload": [{"tensorname": name, "start_idx": 0, "length": 120, "crc32c": 7},
                           {"tensorname": name + "2", "start_idx": 120, "length": 99}],
        "shape_payload": [{"tensorname": name, "originalname": name, "shape": [3, 0]}],
    }
    assert encode_index(index) == json.dumps(reference).encode()
    assert decode_index(encode_index(index), WHERE) == index


def test_encode_index_of_an_index_without_tensors_or_shapes():
    index = make_index(tensors=[], shapes=[], event_file_name=None)
    assert encode_index(index) == json.dumps(
        {"meta": {"mode": "TRAIN", "mode_step": 10}, "tensor_payload": [], "shape_payload": []}).encode()
