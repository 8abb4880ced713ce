"""S3 benchmarks on a local S3 server: mltrace's writer against raw boto3, and reading a 1000-step
trial with mltrace's reader against real smdebug 1.0.34's S3Trial.

The script starts its own SeaweedFS (``weed mini`` of the venv, on free 127.0.0.1 ports, checking
credentials; bench/_support.py) and stops it by PID at the end.

1. Write throughput. The same files a PyTorch hook writes (one events and one index file per step)
   go to S3 three ways, each timed from the first step to the last byte on the server:
   - ``mltrace``: ``TrialWriter`` over ``S3Storage`` (records encoded on the calling thread, files
     uploaded by its background thread, one PUT each);
   - ``put_object``: the identical bytes with boto3 ``put_object``, one file after the other;
   - ``upload_file``: the identical bytes, from local files, with boto3 ``upload_file``.
   Two workloads: ``small`` (many per-step files of a small model) and ``large`` (one 8 MiB
   tensor per step). MB/s and files/s.
2. Read. A 1000-step run of a small model saved every step by mltrace's PyTorch hook (weights,
   biases, loss) is written to the server once; then one tensor's value at every step is read:
   - mltrace: ``create_trial`` + ``tensor.values()`` (the batch API), and ``create_trial`` +
     ``tensor.value(step)`` per step;
   - smdebug (``.venv-legacy``): ``create_trial`` + ``tensor.value(step)`` per step (its
     ``values()`` is that same loop).
   Each reader runs in a process of its own on a fresh trial object per run. Reported: open time
   (create_trial + steps()), ms per value with and without the open, and the speed-up of mltrace
   over smdebug against the target of 10x.

Protocol (bench/protocol.py): one warm-up, then ``--runs`` measured runs (5), medians.
smdebug reads slowly (per value a new boto3 client and a ListObjectsV2 of all of events/: about
5 minutes for 1000 values on 2 busy cores), so a median of five makes no sense there: its warm-up
reads the first ``--smdebug-warmup-values`` (20) values and ``--smdebug-runs`` (1) full runs are
measured. Prints a table; writes bench/results/s3.json (git-ignored).

smdebug's S3Trial sees no steps on SeaweedFS 4.48 without a work-around for a listing bug of that
release (``install_seaweedfs_listing_fix`` in bench/_support.py), which the smdebug reader process
installs.

Example:
    .venv/bin/python bench/s3_bench.py                 # 10-15 minutes on 2 busy cores
    .venv/bin/python bench/s3_bench.py --runs 3 --smdebug-runs 1 --read-steps 300   # quicker
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import protocol

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
os.environ.setdefault("SMDEBUG_LOG_LEVEL", "error")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
RESULTS = os.path.join(REPO, "bench", "results", "s3.json")
READ_TENSOR = "Net_fc1.weight"
TARGET = 10.0


# -- the S3 server -------------------------------------------------------------------------------

def start_server(root: str) -> Any:
    """SeaweedFS on free loopback ports (bench/_support.py), with AWS_* set for this process
    and the reader processes."""
    from _support import SeaweedS3

    server = SeaweedS3(root)
    server.start()
    os.environ.update(server.env())
    return server


def _client() -> Any:
    import boto3

    return boto3.session.Session().client("s3")


# -- 1. write throughput --------------------------------------------------------------------

WORKLOADS = {
    # name: (steps, {tensor: shape}); float32
    "small": (200, {"Net_fc1.weight": (128, 64), "Net_fc1.bias": (128,),
                    "Net_fc2.weight": (10, 128), "Net_fc2.bias": (10,),
                    "gradient/Net_fc1.weight": (128, 64), "gradient/Net_fc2.weight": (10, 128),
                    "CrossEntropyLoss_output_0": ()}),
    "large": (12, {"Net_embedding.weight": (2048, 1024)}),
}


_TENSORS: dict[str, list[list[tuple[str, Any]]]] = {}


def _tensors(workload: str) -> list[list[tuple[str, Any]]]:
    """Per step, the (name, float32 array) pairs of ``workload``; made once, outside the clock."""
    import numpy as np

    if workload not in _TENSORS:
        steps, shapes = WORKLOADS[workload]
        rng = np.random.default_rng(0)
        _TENSORS[workload] = [[(name, rng.standard_normal(shape).astype(np.float32))
                               for name, shape in shapes.items()] for _ in range(steps)]
    return _TENSORS[workload]


def _write_steps(writer: Any, workload: str) -> None:
    """What a hook's writer does for the workload: per step, one events and one index file."""
    from mltrace.modes import ModeKeys

    for step, tensors in enumerate(_tensors(workload)):
        writer.open_step(step, ModeKeys.TRAIN, step)
        for name, value in tensors:
            writer.add_tensor(name, value, ModeKeys.TRAIN, step, wall_time=1.0)
        writer.close_step()


def _recording_storage() -> Any:
    """A Storage that keeps what it is given, to replay the same bytes through boto3."""
    from mltrace.storage.base import Storage

    class Recording(Storage):
        uri = "memory://"

        def __init__(self) -> None:
            self.files: list[tuple[str, bytes]] = []

        def write(self, key: str, data: bytes) -> None:
            self.files.append((key, data))

        def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
            raise FileNotFoundError(key)

        def list(self, prefix: str, start_after: str | None = None) -> list[str]:
            return []

        def exists(self, key: str) -> bool:
            return False

        def local_path(self, key: str) -> str | None:
            return key  # counts as local: the writer keeps no spill folder

    return Recording()


def _files_of(workload: str) -> list[tuple[str, bytes]]:
    from mltrace.writer import TrialWriter

    storage = _recording_storage()
    writer = TrialWriter(storage, "worker_0")
    _write_steps(writer, workload)
    writer.close()
    return storage.files


def bench_write(bucket: str, workload: str, runs: int, tmp: str) -> dict[str, Any]:
    from mltrace.storage.s3 import S3Storage
    from mltrace.writer import TrialWriter

    files = _files_of(workload)
    total = sum(len(d) for _, d in files)
    disk = os.path.join(tmp, f"files-{workload}")
    for i, (_, data) in enumerate(files):
        os.makedirs(disk, exist_ok=True)
        with open(os.path.join(disk, str(i)), "wb") as f:
            f.write(data)
    client = _client()

    def mltrace_run(prefix: str) -> float:
        storage = S3Storage(f"s3://{bucket}/{prefix}")
        storage.client  # noqa: B018 - the client exists before the clock starts (once per job)
        writer = TrialWriter(storage, "worker_0", spill_root=os.path.join(tmp, "spill"))
        add = writer.spill.add

        def counting_add(key: str, data: bytes) -> None:
            spilled.append(key)
            add(key, data)

        writer.spill.add = counting_add  # type: ignore[method-assign]
        t0 = time.perf_counter()
        _write_steps(writer, workload)
        writer.close()
        elapsed = time.perf_counter() - t0
        if writer.failures.count or (writer.spill is not None and writer.spill.pending):
            raise SystemExit(f"mltrace's writer did not upload everything: {writer.failures.messages[:1]}")
        return elapsed

    def put_run(prefix: str) -> float:
        t0 = time.perf_counter()
        for key, data in files:
            client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)
        return time.perf_counter() - t0

    def upload_run(prefix: str) -> float:
        t0 = time.perf_counter()
        for i, (key, _) in enumerate(files):
            client.upload_file(os.path.join(disk, str(i)), bucket, f"{prefix}/{key}")
        return time.perf_counter() - t0

    spilled: list[str] = []  # files the writer kept on local disk while its queue was full
    ways = {"mltrace": mltrace_run, "put_object": put_run, "upload_file": upload_run}
    done = dict.fromkeys(ways, 0)  # runs made each way (the first, run 0, is the warm-up)

    def timed(way: str) -> float:
        gc.collect()
        elapsed = ways[way](f"write/{workload}/{way}/{done[way]}")
        done[way] += 1
        return elapsed

    # the warm-up of each way, then measured run k of each in turn
    times = protocol.interleaved({way: functools.partial(timed, way) for way in ways}, runs)
    out: dict[str, Any] = {"files": len(files), "bytes": total, "steps": WORKLOADS[workload][0]}
    for way, m in times.items():
        med = m.median
        out[way] = {"median_s": med, "runs_s": m.runs, "MB_per_s": total / med / 1e6,
                    "files_per_s": len(files) / med}
    out["mltrace_vs_put_object"] = out["put_object"]["median_s"] / out["mltrace"]["median_s"]
    out["mltrace_spilled_files_per_run"] = len(spilled) / (runs + 1)
    return out


# -- 2. read --------------------------------------------------------------------------------

def write_read_trial(uri: str, steps: int) -> float:
    """A run of ``steps`` steps saved every step by mltrace's PyTorch hook; returns seconds."""
    import torch
    from torch import nn

    import mltrace.pytorch as smd

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(16, 8)
            self.relu = nn.ReLU()
            self.fc2 = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.relu(self.fc1(x)))

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, loss_fn = Net(), nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = smd.Hook(out_dir=uri, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    elapsed = time.perf_counter() - t0
    from mltrace.format import paths
    from mltrace.storage import open_storage

    index_files = open_storage(uri).list(paths.INDEX_DIR)
    if len(index_files) != steps:  # e.g. the writer gave up on S3 at close: not a fair trial
        raise SystemExit(f"the {steps}-step trial on {uri} has {len(index_files)} index files")
    return elapsed


def read_once(lib: str, uri: str, tensor_name: str, how: str,
              limit: int | None = None) -> dict[str, Any]:
    """One run on a fresh trial (runs inside the reader process); ``limit`` reads only the first
    values (a warm-up)."""
    import numpy as np

    if lib == "mltrace":
        from mltrace.trials import create_trial
    else:
        from smdebug.trials import create_trial  # type: ignore[no-redef]
    gc.collect()
    t0 = time.perf_counter()
    trial = create_trial(uri)
    tensor = trial.tensor(tensor_name)
    if how == "values":
        values = tensor.values()
        t1 = t2 = time.perf_counter()
        steps = sorted(values)
        read = [values[s] for s in steps]
    else:
        steps = list(tensor.steps())[:limit]
        t1 = time.perf_counter()
        read = [tensor.value(s) for s in steps]
        t2 = time.perf_counter()
    n = len(read)
    return {"open_s": t1 - t0, "values_s": t2 - t1, "total_s": t2 - t0, "n": n,
            "ms_per_value": (t2 - t1) * 1e3 / n if how != "values" else None,
            "e2e_ms_per_value": (t2 - t0) * 1e3 / n,
            "checksum": float(sum(np.asarray(v, dtype=np.float64).sum() for v in read)),
            "first_steps": steps[:3]}


def reader_main(argv: list[str]) -> int:
    """``s3_bench.py read --lib L --uri U --how values|value --runs N``: one JSON line."""
    parser = argparse.ArgumentParser(prog="s3_bench.py read")
    parser.add_argument("--lib", choices=["mltrace", "smdebug"], required=True)
    parser.add_argument("--uri", required=True)
    parser.add_argument("--how", choices=["values", "value"], default="value")
    parser.add_argument("--tensor", default=READ_TENSOR)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup-values", type=int, default=0, help="0: the warm-up reads all")
    args = parser.parse_args(argv)
    if args.lib == "smdebug":
        from _support import install_seaweedfs_listing_fix

        install_seaweedfs_listing_fix()  # SeaweedFS 4.48's listing bug, see there
    # the warm-up may read fewer values than a measured run (smdebug's reads take minutes)
    warmup = read_once(args.lib, args.uri, args.tensor, "value" if args.warmup_values else args.how,
                       args.warmup_values or None)
    runs = protocol.interleaved({"read": functools.partial(
        read_once, args.lib, args.uri, args.tensor, args.how)}, args.runs, warmup=False)["read"].runs
    print(json.dumps({"warmup": warmup, "runs": runs}))
    return 0


def run_reader(python: str, lib: str, uri: str, how: str, runs: int, timeout: float,
               warmup_values: int = 0) -> dict[str, Any]:
    cmd = [python, os.path.abspath(__file__), "read", "--lib", lib, "--uri", uri, "--how", how,
           "--runs", str(runs), "--warmup-values", str(warmup_values)]
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode:
        raise SystemExit(f"{lib} reader failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    runs_ = data["runs"]

    def med(key: str) -> float | None:
        vals = [r[key] for r in runs_ if r[key] is not None]
        return protocol.median(vals) if vals else None

    return {"lib": lib, "how": how, "python": python, "n_values": runs_[0]["n"], "runs": len(runs_),
            "open_s": med("open_s"), "total_s": med("total_s"), "ms_per_value": med("ms_per_value"),
            "e2e_ms_per_value": med("e2e_ms_per_value"), "checksum": runs_[0]["checksum"],
            "runs_total_s": [r["total_s"] for r in runs_],
            "warmup_total_s": data["warmup"]["total_s"],
            "warmup_values": data["warmup"]["n"]}


# -- report ----------------------------------------------------------------------------------

def print_table(report: dict[str, Any]) -> None:
    print(f"\nS3 benchmark on {report['env']['server']} ({report['env']['cpus']} CPUs, load "
          f"{report['env']['load_start']} -> {report['env']['load_end']}, commit "
          f"{report['env']['machine']['commit']})")
    print(f"\n1. Write throughput (median of {report['runs']}; same bytes each way)")
    print(f"{'workload':<9} {'files':>6} {'MB':>7} | {'way':<12} {'s':>7} {'MB/s':>8} "
          f"{'files/s':>8}")
    for name, w in report["write"].items():
        for i, way in enumerate(("mltrace", "put_object", "upload_file")):
            head = f"{name:<9} {w['files']:>6} {w['bytes'] / 1e6:>7.1f}" if i == 0 else " " * 24
            r = w[way]
            print(f"{head} | {way:<12} {r['median_s']:>7.3f} {r['MB_per_s']:>8.1f} "
                  f"{r['files_per_s']:>8.0f}")
        print(f"{'':<24} | mltrace time / put_object time = {1 / w['mltrace_vs_put_object']:.2f}; "
              f"{w['mltrace_spilled_files_per_run']:.0f} files/run went through the writer's spill")
    read = report["read"]
    print(f"\n2. Read {read['n_values']} values of {read['tensor']!r} ({read['steps']}-step trial, "
          f"written in {read['write_s']:.1f} s)")
    print(f"{'reader':<34} {'runs':>4} {'open s':>8} {'ms/value':>9} {'e2e ms/v':>9} "
          f"{'total s':>8}")
    for row in read["rows"]:
        mpv = "-" if row["ms_per_value"] is None else f"{row['ms_per_value']:.3f}"
        print(f"{row['label']:<34} {row['runs']:>4} {row['open_s']:>8.3f} {mpv:>9} "
              f"{row['e2e_ms_per_value']:>9.3f} {row['total_s']:>8.2f}")
    for key, text in (("speedup_e2e_values", "smdebug value() loop / mltrace values(), end to end"),
                      ("speedup_e2e_value",
                       "smdebug value() loop / mltrace value() loop, end to end"),
                      ("speedup_value_only", "the same, value() calls only (no open)")):
        if read.get(key) is not None:
            verdict = "meets" if read[key] >= TARGET else "MISSES"
            print(f"  {read[key]:7.1f}x  {text} ({verdict} the {TARGET:.0f}x target)")
    if read.get("checksum_mismatch"):
        print("  WARNING: the readers' values differ:", read["checksums"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["read"]:
        return reader_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs after one warm-up")
    parser.add_argument("--smdebug-runs", type=int, default=1, help="smdebug's measured full reads")
    parser.add_argument("--smdebug-warmup-values", type=int, default=20)
    parser.add_argument("--read-steps", type=int, default=1000)
    parser.add_argument("--legacy-python",
                        default=os.path.join(REPO, ".venv-legacy", "bin", "python"))
    parser.add_argument("--skip-smdebug", action="store_true")
    parser.add_argument("--skip-write", action="store_true")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    smd_runs = args.smdebug_runs

    tmp = tempfile.mkdtemp(prefix="mltrace-s3-bench-")
    os.environ["MLTRACE_SPILL_DIR"] = os.path.join(tmp, "spill")
    protocol.warn_if_busy()
    machine = protocol.machine()
    report: dict[str, Any] = {"runs": args.runs, "env": {
        "python": machine["python"], "cpus": machine["cores"],
        "load_start": f"{protocol.load_average():.1f}", "machine": machine}}
    server = start_server(os.path.join(tmp, "weed"))
    try:
        report["env"]["server"] = f"SeaweedFS {_weed_version()} at {server.endpoint}"
        client = _client()
        client.create_bucket(Bucket="bench")
        if not args.skip_write:
            report["write"] = {}
            for workload in WORKLOADS:
                print(f"write: {workload} ...", flush=True)
                report["write"][workload] = bench_write("bench", workload, args.runs, tmp)
        uri = "s3://bench/read/run"
        print(f"read: writing a {args.read_steps}-step trial ...", flush=True)
        read: dict[str, Any] = {"tensor": READ_TENSOR, "steps": args.read_steps,
                                "write_s": write_read_trial(uri, args.read_steps)}
        rows = []
        for how, label in (("values", "mltrace create_trial + values()"),
                           ("value", "mltrace create_trial + value()/step")):
            print(f"read: {label} ...", flush=True)
            row = run_reader(sys.executable, "mltrace", uri, how, args.runs, 1800)
            rows.append(dict(row, label=label))
        if not args.skip_smdebug:
            print(f"read: smdebug ({smd_runs} full run(s) after a "
                  f"{args.smdebug_warmup_values}-value warm-up; minutes) ...", flush=True)
            row = run_reader(args.legacy_python, "smdebug", uri, "value", smd_runs, 3600,
                             args.smdebug_warmup_values)
            rows.append(dict(row, label="smdebug S3Trial + value()/step"))
        read["rows"] = rows
        read["n_values"] = rows[0]["n_values"]
        checksums = {r["label"]: r["checksum"] for r in rows}
        read["checksums"] = checksums
        read["checksum_mismatch"] = len({round(c, 6) for c in checksums.values()}) > 1 or len(
            {r["n_values"] for r in rows}) > 1
        if not args.skip_smdebug:
            smd = rows[-1]
            read["speedup_e2e_values"] = smd["e2e_ms_per_value"] / rows[0]["e2e_ms_per_value"]
            read["speedup_e2e_value"] = smd["e2e_ms_per_value"] / rows[1]["e2e_ms_per_value"]
            read["speedup_value_only"] = smd["ms_per_value"] / rows[1]["ms_per_value"]
            read["target"] = TARGET
        report["read"] = read
    finally:
        server.stop()
        report["env"]["load_end"] = f"{protocol.load_average():.1f}"
        shutil.rmtree(tmp, ignore_errors=True)
    if "write" not in report:
        report["write"] = {}
    print_table(report)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwritten to {args.output}")
    return 0


def _weed_version() -> str:
    try:
        out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "weed"), "version"],
                             capture_output=True, text=True, timeout=10).stdout
        return out.split()[2] if len(out.split()) > 2 else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
