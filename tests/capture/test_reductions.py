"""The reference reductions (numpy definitions) and how stored reductions are named."""

from __future__ import annotations

import numpy as np
import pytest

from mltrace.exceptions import MltraceValueError
from mltrace.format.tensors import BFloat16Bits
from mltrace.reductions import (
    REDUCTION_NAMES,
    canonical_name,
    compute,
    parse_reduction_tensor_name,
    reduction_tensor_name,
)

# The definitions of docs/format.md ("Reductions"), written out with numpy.
DEFINITIONS = {
    "min": np.min,
    "max": np.max,
    "mean": np.mean,
    "std": lambda a: np.std(a, ddof=0),
    "variance": lambda a: np.var(a, ddof=0),
    "sum": np.sum,
    "prod": np.prod,
    "median": np.median,
    "l1": lambda a: np.sum(np.abs(a)),
    "l2": lambda a: np.sqrt(np.sum(a.astype(np.float64) ** 2)),
}

ARRAYS = {
    "1d": np.array([1.0, -2.0, 3.5, -4.25, 0.0]),
    "2d": np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]]),
    "3d": np.arange(-12, 12, dtype=np.float64).reshape(2, 3, 4) / 3,
    "0d": np.array(-2.5),
    "f32": np.linspace(-1, 1, 7, dtype=np.float32).reshape(7, 1),
}


@pytest.mark.parametrize("key", list(ARRAYS))
@pytest.mark.parametrize("name", list(DEFINITIONS))
@pytest.mark.parametrize("use_abs", [False, True], ids=["plain", "abs"])
def test_compute_matches_numpy_definition(name, key, use_abs):
    array = ARRAYS[key]
    source = np.abs(array) if use_abs else array
    expected = DEFINITIONS[name](source.reshape(-1))
    got = compute(name, array, abs=use_abs)
    assert isinstance(got, np.ndarray) and got.shape == ()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_norms_are_flat_even_for_matrices():
    matrix = np.array([[3.0, -4.0], [1.0, 2.0]])
    # np.linalg.norm(ord=1|2) on a 2-D array is the matrix norm, which smdebug wrongly used.
    assert float(compute("l1", matrix)) == 10.0
    assert float(compute("l1", matrix)) != np.linalg.norm(matrix, ord=1)
    np.testing.assert_allclose(compute("l2", matrix), np.sqrt(30.0))
    assert not np.isclose(np.linalg.norm(matrix, ord=2), np.sqrt(30.0))
    cube = np.arange(24, dtype=np.float64).reshape(2, 3, 4) - 10
    np.testing.assert_allclose(compute("l1", cube), np.abs(cube).sum())
    np.testing.assert_allclose(compute("l2", cube), np.sqrt((cube**2).sum()))


def test_norm_aliases():
    array = ARRAYS["2d"]
    assert compute("l1_norm", array) == compute("l1", array)
    assert compute("l2_norm", array, abs=True) == compute("l2", array)
    assert canonical_name("l2_norm") == "l2"


def test_std_and_variance_are_biased():
    array = np.array([1.0, 2.0, 3.0, 4.0])
    assert float(compute("variance", array)) == 1.25
    np.testing.assert_allclose(compute("std", array), np.sqrt(1.25))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint64"])
def test_ints_are_computed_in_float64(dtype):
    info = np.iinfo(dtype)
    array = np.array([info.max, info.max, info.max, info.min + 1], dtype=dtype)
    wide = array.astype(np.float64)
    assert float(compute("sum", array)) == wide.sum()  # no wrap-around in the int dtype
    assert float(compute("mean", array)) == wide.mean()
    assert float(compute("prod", array)) == np.prod(wide)
    np.testing.assert_allclose(compute("l2", array), np.sqrt((wide**2).sum()))
    assert compute("sum", array).dtype == np.float64


def test_abs_of_int8_min_does_not_wrap():
    array = np.array([-128, 1], dtype=np.int8)
    assert float(compute("max", array, abs=True)) == 128.0
    assert float(compute("l1", array)) == 129.0


def test_bools_are_computed_as_numbers():
    array = np.array([True, False, True, True])
    assert float(compute("mean", array)) == 0.75
    assert float(compute("sum", array)) == 3.0
    assert float(compute("zero_fraction", array)) == 0.25


def test_float16_and_float32_results_are_float64():
    for dtype in (np.float16, np.float32):
        got = compute("mean", np.array([0.5, 1.5], dtype=dtype))
        assert got.dtype == np.float64 and float(got) == 1.0


def test_bfloat16_bits_are_reduced_as_their_values():
    bits = np.array([0x3F80, 0xC000, 0x4040], dtype=np.uint16).view(BFloat16Bits)  # 1, -2, 3
    assert float(compute("sum", bits)) == 2.0
    assert float(compute("min", bits)) == -2.0


@pytest.mark.parametrize(
    "name", ["min", "max", "mean", "std", "variance", "sum", "prod", "median", "l1", "l2"]
)
def test_nan_propagates(name):
    array = np.array([1.0, np.nan, 3.0])
    assert np.isnan(compute(name, array))
    assert np.isnan(compute(name, array, abs=True))


def test_inf_behaves_as_numpy():
    array = np.array([1.0, np.inf, -2.0])
    assert float(compute("max", array)) == np.inf
    assert float(compute("min", array, abs=True)) == 1.0
    assert float(compute("l1", array)) == np.inf


def test_nan_count_inf_count_zero_fraction():
    array = np.array([[0.0, np.nan, np.inf], [-np.inf, 0.0, 5.0], [np.nan, np.nan, -0.0]])
    nan_count = compute("nan_count", array)
    inf_count = compute("inf_count", array)
    assert int(nan_count) == 3 and nan_count.dtype == np.int64
    assert int(inf_count) == 2 and inf_count.dtype == np.int64
    assert float(compute("zero_fraction", array)) == pytest.approx(3 / 9)
    assert int(compute("nan_count", array, abs=True)) == 3


def test_counts_on_ints_and_complex():
    assert int(compute("nan_count", np.array([1, 2, 3], dtype=np.int32))) == 0
    assert int(compute("inf_count", np.array([1, 2], dtype=np.uint8))) == 0
    assert float(compute("zero_fraction", np.array([0, 0, 1, 2], dtype=np.int64))) == 0.5
    assert int(compute("nan_count", np.array([complex(np.nan, 0), 1 + 1j]))) == 1


def test_complex_norms():
    array = np.array([3 + 4j, 0 + 0j])
    assert float(compute("l2", array)) == 5.0
    assert float(compute("l1", array)) == 5.0
    assert float(compute("max", array, abs=True)) == 5.0


@pytest.mark.parametrize("name", REDUCTION_NAMES)
@pytest.mark.parametrize(
    "empty", [np.zeros(0), np.zeros((3, 0), dtype=np.int32), np.array([], bool)]
)
def test_empty_tensors_have_no_reductions(name, empty):
    assert compute(name, empty) is None
    assert compute(name, empty, abs=True) is None


def test_strings_have_no_reductions():
    assert compute("mean", np.array(["a", "b"])) is None


@pytest.mark.parametrize("name", ["bogus", "abs_mean", "l3", "mean_norm"])
def test_unknown_reduction_names_the_choices(name):
    with pytest.raises(MltraceValueError) as info:
        compute(name, np.ones(3))
    assert repr(name) in str(info.value)
    assert "min, max, mean" in str(info.value)


def test_reduction_tensor_name_round_trip():
    name = reduction_tensor_name("gradient/Net_fc1.weight", "mean", abs=True)
    assert name == "smdebug/reductions/abs_mean/gradient/Net_fc1.weight"
    assert parse_reduction_tensor_name(name) == ("gradient/Net_fc1.weight", "mean", True)


@pytest.mark.parametrize(
    ("tensor", "reduction", "use_abs", "stored"),
    [
        ("Net_fc1.weight", "l2_norm", False, "smdebug/reductions/l2/Net_fc1.weight"),
        ("dense/kernel:0", "l1", True, "smdebug/reductions/abs_l1/dense/kernel:0"),
        ("x", "nan_count", False, "smdebug/reductions/nan_count/x"),
        ("a/b/c", "zero_fraction", False, "smdebug/reductions/zero_fraction/a/b/c"),
    ],
)
def test_reduction_names(tensor, reduction, use_abs, stored):
    assert reduction_tensor_name(tensor, reduction, use_abs) == stored
    assert parse_reduction_tensor_name(stored) == (tensor, canonical_name(reduction), use_abs)


@pytest.mark.parametrize(
    "name",
    ["Net_fc1.weight", "smdebug/reductions/mean", "smdebug/reductions/", "reductions/mean/x"],
)
def test_parse_reduction_tensor_name_of_other_names(name):
    assert parse_reduction_tensor_name(name) is None


def test_reduction_tensor_name_rejects_unknown_reduction():
    with pytest.raises(MltraceValueError, match="'average'"):
        reduction_tensor_name("x", "average", False)
