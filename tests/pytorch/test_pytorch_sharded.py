"""Sharded tensors (mltrace.pytorch.sharded): real gloo jobs of 2 and 4 processes on this machine
distribute known tensors as DTensors (rows over a 1-D mesh as FSDP2 does, evenly and unevenly,
with fewer rows than ranks; columns, replicated and 2-D meshes for the fallbacks), and every rank
records what ``gather_full`` and ``sharded_reductions`` gave it and the bytes each call counted.

One job per world size runs every case (starting processes costs more than the cases); the tests
compare each rank's records with the full tensor and with ``torch_reductions`` of it.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mltrace.pytorch.reductions import torch_reductions
from mltrace.pytorch.sharded import (
    bytes_moved,
    gather_full,
    is_sharded,
    reset_bytes_moved,
    sharded_reductions,
)
from mltrace.reductions import REDUCTION_NAMES
from tests.support.ddp_training import free_port

#: Every reduction but median, plain and of the absolute value: combined from shards.
ITEMS = [(name, abs_) for name in REDUCTION_NAMES if name != "median" for abs_ in (False, True)]
#: With median (gathered), and an alias spelling.
MEDIAN_ITEMS = [("median", False), ("median", True), ("l2_norm", False), ("min", True)]
BIG = 1_000_000
#: Layouts: (mesh shape as a function of the world size, placements by name).
LAYOUTS = {
    "rows": (lambda w: (w,), ("shard0",)),
    "cols": (lambda w: (w,), ("shard1",)),
    "replicate": (lambda w: (w,), ("replicate",)),
    "rows_x_replicate": (lambda w: (2, w // 2), ("shard0", "replicate")),
    "rows_x_cols": (lambda w: (2, w // 2), ("shard0", "shard1")),
}


def _with_specials(t: torch.Tensor) -> torch.Tensor:
    """``t`` (rows of 2) with +inf in the first row, -inf in the middle and NaN in the last."""
    t[0, 0], t[t.shape[0] // 2, 1], t[-1, 1] = math.inf, -math.inf, math.nan
    return t


def cases(world: int) -> dict[str, tuple[torch.Tensor, str]]:
    """Case name: (full tensor, layout); the same tensors on every rank and in the test."""
    g = torch.Generator().manual_seed(1234)
    randn = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    out = {
        "even": (randn(8, 3), "rows"),
        "uneven": (randn(5, 3), "rows"),
        "fewer_rows_1d": (randn(3), "rows"),
        "one_row": (randn(1, 4), "rows"),
        "3d": (randn(7, 2, 3), "rows"),
        "bf16": (randn(5, 4).bfloat16(), "rows"),
        "int64": (torch.randint(-3, 4, (6, 3), generator=g), "rows"),
        "bool": (torch.rand(9, generator=g) > 0.5, "rows"),
        "nan_inf": (_with_specials(randn(9, 2)), "rows"),
        "inf_only": (torch.tensor([1.0, -2.0, 0.0, 3.0, 0.5, math.inf]), "rows"),
        "large_mean": (1e4 + 1e-3 * randn(10, 3).double(), "rows"),
        "empty": (torch.zeros(0, 3), "rows"),
        "big": (1.0 + 1e-3 * randn(BIG), "rows"),
        "cols": (randn(4, 8), "cols"),
        "replicate": (randn(5, 3), "replicate"),
    }
    if world == 4:
        out["rows_x_replicate"] = (randn(5, 3), "rows_x_replicate")
        out["rows_x_cols"] = (randn(5, 6), "rows_x_cols")
    return out


# -- the job (each rank runs this in its own process) ----------------------------------------------
def _placements(names: tuple[str, ...]) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    return [{"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}[n] for n in names]


def _measured(call: Any) -> tuple[Any, int]:
    reset_bytes_moved()
    result = call()
    return result, bytes_moved()


def _record(dt: Any) -> dict[str, Any]:
    """What this rank got from each call, and the bytes the call counted."""
    to_0, to_0_bytes = _measured(lambda: gather_full(dt, 0))
    everywhere, everywhere_bytes = _measured(lambda: gather_full(dt, None))
    reductions, reduction_bytes = _measured(lambda: sharded_reductions(dt, ITEMS))
    return {"is_sharded": is_sharded(dt), "to_0": to_0, "to_0_bytes": to_0_bytes,
            "everywhere": everywhere, "everywhere_bytes": everywhere_bytes,
            "reductions": reductions, "reduction_bytes": reduction_bytes,
            "median": sharded_reductions(dt, MEDIAN_ITEMS)}


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    if os.path.exists("/sys/class/net/lo"):  # this process's gloo connections on loopback
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        meshes = {shape: init_device_mesh("cpu", shape)
                  for shape in {make(world) for make, _ in LAYOUTS.values()}}
        records = {}
        for name, (full, layout) in cases(world).items():
            make_shape, placements = LAYOUTS[layout]
            dt = distribute_tensor(full, meshes[make_shape(world)], _placements(placements))
            records[name] = _record(dt)
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(records, f)
    finally:
        dist.destroy_process_group()


def _run_job(world: int, out_dir: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """Run the job with ``world`` processes; each rank's records, by rank."""
    context = mp.start_processes(_worker, args=(world, free_port(), out_dir), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1):  # raises if a rank failed, with its traceback
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world}-process job ran past {timeout} s")
    finally:
        for process in context.processes:  # only the processes started here
            if process.is_alive():
                process.kill()
                process.join()
    records = []
    for rank in range(world):
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
            records.append(pickle.load(f))
    return records


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def job(request, tmp_path_factory) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    return world, _run_job(world, str(tmp_path_factory.mktemp(f"sharded{world}")))


# -- the checks -----------------------------------------------------------------------------------
def _same_tensor(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _same_reductions(got: list, want: list, items: list, rtol: float, where: str) -> None:
    assert len(got) == len(want) == len(items), where
    for item, g, w in zip(items, got, want):
        if w is None:
            assert g is None, (where, item)
            continue
        assert isinstance(g, np.ndarray) and g.shape == () and g.dtype == w.dtype, (where, item, g)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=0, equal_nan=True,
                                   err_msg=f"{where}: {item}")


def test_is_sharded_only_for_dtensors(job):
    world, records = job
    assert not is_sharded(torch.zeros(3)) and not is_sharded(np.zeros(3)) and not is_sharded(None)
    assert all(r[name]["is_sharded"] for r in records for name in r)


def test_gather_full_to_one_rank_and_to_all(job):
    world, records = job
    for name, (full, _) in cases(world).items():
        for rank, record in enumerate(records):
            got = record[name]
            if rank == 0:
                _same_tensor(got["to_0"], full)
            else:
                assert got["to_0"] is None, (name, rank)
            _same_tensor(got["everywhere"], full)


def test_gather_to_one_rank_moves_only_to_it(job):
    """Row shards go to rank 0 alone: it sends nothing, every other rank sends one padded shard."""
    world, records = job
    for name, (full, layout) in cases(world).items():
        if layout != "rows":
            continue
        rows = -(-full.shape[0] // world)
        shard_bytes = rows * math.prod(full.shape[1:]) * full.element_size()
        assert [r[name]["to_0_bytes"] for r in records] == [0] + [shard_bytes] * (world - 1), name


@pytest.mark.parametrize("which", ["reductions", "median"])
def test_sharded_reductions_match_the_full_tensor(job, which):
    world, records = job
    items = ITEMS if which == "reductions" else MEDIAN_ITEMS
    for name, (full, _) in cases(world).items():
        want = torch_reductions(full, items)
        # The reference multiplies a million float32 values one by one; float64 partials do not.
        rtol = 1e-3 if name == "big" else 1e-5
        for rank, record in enumerate(records):
            _same_reductions(record[name][which], want, items, rtol, f"{name} on rank {rank}")


def test_reductions_move_scalars_not_tensors(job):
    """A reductions-only configuration moves a few scalars: orders of magnitude below gathering."""
    world, records = job
    gathered = sum(r["big"]["to_0_bytes"] for r in records)
    reduced = sum(r["big"]["reduction_bytes"] for r in records)
    assert gathered == (world - 1) * (BIG // world) * 4
    assert 0 < reduced < 200 * world * (world - 1)  # four all-reduces of a few float64 at most
    assert gathered > 1000 * reduced
    # Every layout of shards (1-D or 2-D mesh, rows or columns) is reduced the same way.
    most = 15 * 8 * (world - 1)  # 15 float64 partials, sent to each other rank
    for name, (full, layout) in cases(world).items():
        if layout != "replicate" and full.numel():
            assert all(0 < r[name]["reduction_bytes"] <= most for r in records), name
    # A replicated tensor is whole on every rank: its reductions move nothing at all.
    assert all(r["replicate"]["reduction_bytes"] == 0 for r in records)


def test_other_layouts_fall_back_to_full_tensor(job):
    """Columns (and 2-D meshes) are made whole on every rank: each rank sends its shard."""
    world, records = job
    for name in ("cols", "rows_x_cols"):
        if name in records[0]:
            assert all(r[name]["to_0_bytes"] > 0 for r in records), name
    assert all(r["replicate"]["to_0_bytes"] == 0 for r in records)
