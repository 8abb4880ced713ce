"""Long run: 10,000 steps saved every step; is resident memory flat, and is every file there?

Run with the main venv from the repository root:

    .venv/bin/python bench/long_run.py                 # 10,000 steps, about 1-3 minutes
    .venv/bin/python bench/long_run.py --steps 2000 --out /tmp/long_run   # keep the trial

Two child processes of this script train the same seeded MLP side by side (started together,
each with one torch thread): one with no hook, the baseline for how much torch and the allocator
drift by themselves, and one with ``mltrace.pytorch.Hook(save_interval=1)`` saving weights,
biases, gradients and losses (9 tensors a step). Each samples its own resident memory (VmRSS of
/proc/self/status, after gc.collect()) before the first step and every ``--sample-every`` steps;
the hook's child also records the sizes of every list, dict, set and queue held by the hook, its
writer, its storage and its collections, which is how a container that grows per step shows up.

The parent then reports RSS at step 1,000 and at the last step, the growth between them (MiB and
MiB per 1,000 steps), a least-squares slope over the samples from step 1,000 on, the same for the
baseline and the hook's growth beyond it (verdict "flat" if that is at most 2 MiB over 9,000
steps, scaled to ``--steps``). It counts the trial's files and bytes against what one step's files
predict (files = 2 per step per worker + collections file + the worker's done file + the end
marker; bytes ~= steps x bytes of step 0's two files + the rest; step numbers make later files a
few bytes longer, so bytes must agree within 1%), opens the trial with create_trial, checks that
every step is present for every tensor, and compares the values saved at a few steps with the
values the training loop saw. Results: a table on stdout and bench/results/long_run.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import protocol

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
COLLECTIONS = ["weights", "biases", "gradients", "losses"]
BATCH, N_IN, N_HIDDEN, N_OUT = 64, 32, 64, 1
DATA_POOL = 64  # distinct batches, cycled (no per-step data allocation in the measured loop)
FLAT_MIB_PER_9000 = 2.0  # allowed growth beyond the baseline over steps 1,000..10,000
BYTES_TOLERANCE = 0.01
MIB = 1024 * 1024


# -- child: one training loop ---------------------------------------------------------------------
def rss_bytes() -> int:
    """Resident set size of this process (VmRSS), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def container_sizes(hook: Any) -> dict[str, int]:
    """len() of every container attribute of the hook, its writer, storage, TensorBoard writer,
    spill folder and collections: what would have to grow for memory to grow per step."""
    owners: list[tuple[str, Any]] = [("hook", hook), ("storage", hook.storage)]
    writer = getattr(hook, "writer", None)
    if writer is not None:
        owners += [("writer", writer), ("writer.spill", writer.spill)]
    owners.append(("tensorboard", getattr(hook, "tensorboard", None)))
    for name, coll in hook.collection_manager.get_collections().items():
        owners.append((f"collection[{name}]", coll))
    sizes: dict[str, int] = {}
    for owner, obj in owners:
        if obj is None or not hasattr(obj, "__dict__"):
            continue
        for attr, value in vars(obj).items():
            if isinstance(value, (list, dict, set, frozenset, tuple, deque, bytearray, bytes)):
                sizes[f"{owner}.{attr}"] = len(value)
            elif isinstance(value, queue.Queue) and value.maxsize <= 0:  # a bounded one cannot grow
                sizes[f"{owner}.{attr}"] = value.qsize()
    return sizes


def child(lib: str, steps: int, every: int, trial_dir: str | None, spot_file: str | None) -> dict:
    """Train ``steps`` steps with no hook or mltrace's; return the samples as a dict."""
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(BATCH, N_IN, generator=gen), torch.randn(BATCH, N_OUT, generator=gen))
            for _ in range(DATA_POOL)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(N_IN, N_HIDDEN), nn.ReLU(), nn.Linear(N_HIDDEN, N_OUT))
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = None
    if lib == "mltrace":
        import mltrace.pytorch as smd

        hook = smd.Hook(out_dir=trial_dir, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=list(COLLECTIONS))
        hook.register_module(model)
        hook.register_loss(loss_fn)
    spot_steps = sorted({0, 1, min(1000, steps - 1), steps // 2, steps - 1})
    spots: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []

    def sample(step: int) -> None:
        gc.collect()
        row: dict[str, Any] = {"step": step, "rss": rss_bytes()}
        if hook is not None:
            row["containers"] = container_sizes(hook)
        samples.append(row)

    sample(0)
    start = time.perf_counter()
    for step in range(steps):
        x, y = data[step % DATA_POOL]
        if step in spot_steps:  # the hook saves parameters at the start of the step, as here
            for pname, p in model.named_parameters():
                spots[f"{step}|Sequential_{pname}"] = p.detach().numpy().copy()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if step in spot_steps:
            spots[f"{step}|MSELoss_output_0"] = loss.detach().numpy().copy()
            for pname, p in model.named_parameters():
                spots[f"{step}|gradient/Sequential_{pname}"] = p.grad.detach().numpy().copy()
        opt.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            sample(step + 1)
    loop_s = time.perf_counter() - start
    close_start = time.perf_counter()
    if hook is not None:
        hook.close()
    close_s = time.perf_counter() - close_start
    if spot_file:
        np.savez(spot_file, **{k.replace("/", "~"): v for k, v in spots.items()})
    return {"lib": lib, "steps": steps, "samples": samples, "loop_s": loop_s, "close_s": close_s,
            "rss_after_close": rss_bytes(), "torch": torch.__version__}


# -- parent: run both, check the trial, report ----------------------------------------------------
def fit_slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (bytes) over steps; bytes per step."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(s for s, _ in points) / n
    my = sum(r for _, r in points) / n
    sxx = sum((s - mx) ** 2 for s, _ in points)
    return sum((s - mx) * (r - my) for s, r in points) / sxx if sxx else 0.0


def memory_summary(result: dict[str, Any], from_step: int) -> dict[str, Any]:
    samples = result["samples"]
    at = {s["step"]: s["rss"] for s in samples}
    first = min((s for s in at if s >= from_step), default=samples[-1]["step"])
    last = samples[-1]["step"]
    growth = at[last] - at[first]
    span = max(last - first, 1)
    slope = fit_slope([(s["step"], s["rss"]) for s in samples if s["step"] >= first])
    return {
        "from_step": first, "to_step": last,
        "rss_start_mib": samples[0]["rss"] / MIB, "rss_from_mib": at[first] / MIB,
        "rss_to_mib": at[last] / MIB, "rss_max_mib": max(at.values()) / MIB,
        "growth_mib": growth / MIB, "growth_mib_per_1000": growth / MIB * 1000 / span,
        "slope_mib_per_1000": slope * 1000 / MIB,
        "loop_s": result["loop_s"], "close_s": result["close_s"],
    }


def growing_containers(result: dict[str, Any], from_step: int) -> dict[str, list[int]]:
    """Containers whose size at the last sample is above their size at ``from_step``."""
    rows = [s for s in result["samples"] if "containers" in s]
    base = next((s for s in rows if s["step"] >= from_step), rows[0])
    last = rows[-1]
    return {k: [base["containers"].get(k, 0), v] for k, v in sorted(last["containers"].items())
            if v > base["containers"].get(k, 0)}


def largest_containers(result: dict[str, Any], n: int = 6) -> dict[str, int]:
    last = [s for s in result["samples"] if "containers" in s][-1]["containers"]
    return dict(sorted(last.items(), key=lambda kv: -kv[1])[:n])


def check_files(trial_dir: str, steps: int) -> dict[str, Any]:
    """Count files and bytes under the trial and compare with what step 0's files predict."""
    from mltrace.format import paths

    files: dict[str, int] = {}
    for dirpath, _dirs, names in os.walk(trial_dir):
        for name in names:
            full = os.path.join(dirpath, name)
            files[os.path.relpath(full, trial_dir).replace(os.sep, "/")] = os.path.getsize(full)
    worker = paths.DEFAULT_WORKER_NAME
    first = [paths.event_file_key(0, worker), paths.index_file_key(0, worker)]
    step_bytes = sum(files.get(k, 0) for k in first)
    other = [paths.collections_file_key(worker), f"{paths.WORKERS_DONE_DIR}/{worker}",
             paths.END_OF_JOB_MARKER]
    expected_files = 2 * steps * 1 + len(other)  # 1 worker
    expected_bytes = steps * step_bytes + sum(files.get(k, 0) for k in other)
    found_bytes = sum(files.values())
    per_step = {}
    for step in (0, steps - 1):
        per_step[step] = sum(files.get(k, 0) for k in (paths.event_file_key(step, worker),
                                                        paths.index_file_key(step, worker)))
    step_keys = {k for s in range(steps) for k in (paths.event_file_key(s, worker),
                                                   paths.index_file_key(s, worker))}
    missing = sorted(k for k in [*step_keys, *other] if k not in files)
    extra = sorted(k for k in files if k not in step_keys and k not in other)
    bytes_diff = (found_bytes - expected_bytes) / expected_bytes if expected_bytes else 1.0
    return {
        "files_expected": expected_files, "files_found": len(files),
        "files_missing": missing[:20], "files_missing_count": len(missing),
        "files_extra": extra[:20], "files_extra_count": len(extra),
        "bytes_per_step_first": per_step[0], "bytes_per_step_last": per_step[steps - 1],
        "bytes_expected": expected_bytes, "bytes_found": found_bytes, "bytes_diff": bytes_diff,
        "files_ok": len(files) == expected_files and not missing and not extra,
        "bytes_ok": abs(bytes_diff) <= BYTES_TOLERANCE,
    }


def check_trial(trial_dir: str, steps: int, spot_file: str) -> dict[str, Any]:
    """Open the trial; every step present for every tensor; spot values equal the loop's."""
    import numpy as np

    from mltrace.trials import create_trial

    start = time.perf_counter()
    trial = create_trial(trial_dir)
    names = trial.tensor_names()
    want = list(range(steps))
    problems = []
    if trial.steps() != want:
        problems.append(f"trial.steps(): {len(trial.steps())} steps, expected 0..{steps - 1}")
    for name in names:
        got = trial.tensor(name).steps()
        if got != want:
            gone = sorted(set(want) - set(got))[:5]
            problems.append(f"{name}: {len(got)} steps (missing e.g. {gone})")
    spots = np.load(spot_file)
    compared = 0
    for key in spots.files:
        step_s, name = key.replace("~", "/").split("|", 1)
        expected = spots[key]
        if name not in names:
            problems.append(f"{name}: not in the trial")
            continue
        got = trial.tensor(name).value(int(step_s))
        compared += 1
        if got.size != expected.size or not np.array_equal(got, expected.reshape(got.shape)):
            problems.append(f"{name} at step {step_s}: saved value differs from the loop's")
    return {"tensors": len(names), "tensor_names": names, "steps_found": len(trial.steps()),
            "values_compared": compared, "problems": problems[:20], "ok": not problems,
            "read_s": time.perf_counter() - start}


def run_children(steps: int, every: int, trial_dir: str, spot_file: str) -> dict[str, dict]:
    env = dict(os.environ, MLTRACE_LOG_LEVEL="error", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = {}
    for lib in ("none", "mltrace"):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", lib, "--steps", str(steps),
               "--sample-every", str(every)]
        if lib == "mltrace":
            cmd += ["--trial", trial_dir, "--spot-file", spot_file]
        procs[lib] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
    results = {}
    for lib, proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"child {lib} failed (exit {proc.returncode}):\n{err[-4000:]}")
        results[lib] = json.loads(out.strip().splitlines()[-1])
    return results


def print_table(report: dict[str, Any]) -> None:
    hook, base = report["memory"]["mltrace"], report["memory"]["none"]
    a, b = hook["from_step"], hook["to_step"]
    print(f"long run: {report['steps']} steps, save_interval 1, {report['trial']['tensors']} "
          f"tensors a step, MLP {report['model']}, "
          f"load {report['load_start']:.2f} -> {report['load_end']:.2f}")
    print(f"{'':10s} {'RSS@0':>8s} {f'RSS@{a}':>9s} {f'RSS@{b}':>10s} {'growth':>8s} "
          f"{'/1000':>7s} {'slope/1000':>10s} {'loop s':>7s}")
    for label, m in (("no hook", base), ("mltrace", hook)):
        print(f"{label:10s} {m['rss_start_mib']:8.2f} {m['rss_from_mib']:9.2f} "
              f"{m['rss_to_mib']:10.2f} {m['growth_mib']:8.3f} {m['growth_mib_per_1000']:7.3f} "
              f"{m['slope_mib_per_1000']:10.4f} "
              f"{m['loop_s']:7.1f}")
    mem = report["memory"]
    ratio = mem["growth_ratio"]
    print(f"(MiB) growth beyond no hook: {mem['excess_growth_mib']:.3f} MiB over steps {a}..{b} "
          f"(limit {mem['limit_mib']:.2f}) -> {'FLAT' if mem['flat'] else 'GROWS'}; hook/no-hook: "
          f"growth ratio {'n/a (no-hook growth < 0.05 MiB)' if ratio is None else f'{ratio:.2f}'}, "
          f"RSS ratio at step {b} {mem['rss_ratio']:.3f}")
    if report["growing_containers"]:
        print("containers that grew from step", a, "on:",
              ", ".join(f"{k} {v[0]}->{v[1]}" for k, v in report["growing_containers"].items()))
    else:
        print("containers that grew from step", a, "on: none (largest:",
              ", ".join(f"{k}={v}" for k, v in report["largest_containers"].items()) + ")")
    f = report["files"]
    print(f"files: expected {f['files_expected']}, found {f['files_found']} "
          f"({f['files_missing_count']} missing, {f['files_extra_count']} extra) -> "
          f"{'OK' if f['files_ok'] else 'MISMATCH'}")
    print(f"bytes: expected {f['bytes_expected']:,}, found {f['bytes_found']:,} "
          f"({f['bytes_diff']:+.3%}; "
          f"step 0 {f['bytes_per_step_first']:,} B, last step {f['bytes_per_step_last']:,} B) -> "
          f"{'OK' if f['bytes_ok'] else 'MISMATCH'}")
    t = report["trial"]
    verdict = "OK" if t["ok"] else "PROBLEMS: " + "; ".join(t["problems"])
    print(f"trial: {t['steps_found']} steps, {t['tensors']} tensors, {t['values_compared']} spot "
          f"values compared, read in {t['read_s']:.1f} s -> {verdict}")
    print(f"wall: {report['wall_s']:.1f} s (hook close {hook['close_s']:.2f} s); "
          f"written to {report['results_path']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--out", default=None,
                        help="directory for the trial, kept afterwards (default: a temp dir, "
                        "deleted)")
    parser.add_argument("--results", default=str(BENCH / "results" / "long_run.json"),
                        help="where the JSON report goes")
    parser.add_argument("--sample-every", type=int, default=250, help="steps between RSS samples")
    parser.add_argument("--child", choices=("none", "mltrace"), help=argparse.SUPPRESS)
    parser.add_argument("--trial", help=argparse.SUPPRESS)
    parser.add_argument("--spot-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.sample_every < 1:
        parser.error("--steps must be >= 2 and --sample-every >= 1")
    if args.child:
        result = child(args.child, args.steps, args.sample_every, args.trial, args.spot_file)
        print(json.dumps(result))
        return 0

    workdir = args.out or tempfile.mkdtemp(prefix="mltrace-long-run-")
    trial_dir = os.path.join(workdir, "trial")
    if os.path.exists(trial_dir):
        parser.error(f"--out {workdir}: {trial_dir} exists; pass a new directory")
    os.makedirs(workdir, exist_ok=True)
    spot_file = os.path.join(workdir, "spot_values.npz")
    protocol.warn_if_busy()
    machine = protocol.machine()
    load_start = protocol.load_average()
    start = time.perf_counter()
    try:
        results = run_children(args.steps, args.sample_every, trial_dir, spot_file)
        wall = time.perf_counter() - start
        files = check_files(trial_dir, args.steps)
        trial = check_trial(trial_dir, args.steps, spot_file)
    finally:
        if args.out is None:
            shutil.rmtree(workdir, ignore_errors=True)
    from_step = min(1000, args.steps // 10)
    memory: dict[str, Any] = {lib: memory_summary(r, from_step) for lib, r in results.items()}
    span = memory["mltrace"]["to_step"] - memory["mltrace"]["from_step"]
    excess = memory["mltrace"]["growth_mib"] - memory["none"]["growth_mib"]
    limit = FLAT_MIB_PER_9000 * max(span, 1) / 9000
    base_growth = memory["none"]["growth_mib"]
    memory.update({
        "excess_growth_mib": excess, "limit_mib": limit, "flat": excess <= limit,
        "growth_ratio": (memory["mltrace"]["growth_mib"] / base_growth
                         if abs(base_growth) > 0.05 else None),
        "rss_ratio": memory["mltrace"]["rss_to_mib"] / memory["none"]["rss_to_mib"],
    })
    report = {
        "steps": args.steps, "sample_every": args.sample_every, "batch": BATCH,
        "model": f"{N_IN}-{N_HIDDEN}-{N_OUT}", "collections": COLLECTIONS,
        "memory": memory, "files": files, "trial": trial,
        "growing_containers": growing_containers(results["mltrace"], from_step),
        "largest_containers": largest_containers(results["mltrace"]),
        "samples": {lib: r["samples"] for lib, r in results.items()},
        "wall_s": wall, "load_start": load_start, "load_end": protocol.load_average(),
        "commit": machine["commit"], "python": machine["python"], "machine": machine,
        "torch": results["none"]["torch"],
        "results_path": args.results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(report, f, indent=1)
    print_table(report)
    ok = memory["flat"] and files["files_ok"] and files["bytes_ok"] and trial["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
