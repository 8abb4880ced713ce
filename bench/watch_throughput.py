"""``mltrace watch`` throughput: finished trials on S3, three rules each, run by one watcher with
the local process pool and with Ray on the same cores, side by side in one run.

The script starts its own SeaweedFS (bench/_support.py, free 127.0.0.1 ports) and a one-node
Ray cluster (``ray start --head --block`` with ``--num-cpus`` = the pool size), both stopped by
PID at the end. It writes ``--trials`` finished trials of ``--steps`` steps (two gradients and a
loss per step, mltrace's own writer) under one prefix, then for each executor clears the rule
state of every trial (``mltrace_watch/``, ``mltrace_rules/``) and times a watcher
(``Watcher.run(exit_when_done=True)``) from start to the last execution's end. No MLflow: what
is timed is discovery, scheduling and rule evaluation.

With ``--rounds N`` the two executors alternate N times (bench/protocol.py's ``interleaved``, no
warm-up run) and the best run of each is reported
(the pool's processes and Ray's workers are then both warm after the first round). Reported:
wall time per executor, rule executions per second, trials per minute one watcher
sustains, and Ray's cost per execution, (Ray wall - pool wall) / executions, beside the round
trip of an empty Ray task measured on the same cluster.

Example:
    .venv/bin/python bench/watch_throughput.py                        # 50 trials x 200 steps
    .venv/bin/python bench/watch_throughput.py --trials 10 --steps 50 # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import protocol

os.environ.setdefault("MLTRACE_LOG_LEVEL", "error")
os.environ.pop("MLFLOW_TRACKING_URI", None)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
RESULTS = os.path.join(REPO, "bench", "results", "watch.json")
BUCKET = "bench-watch"
RULES = [{"RuleName": "VanishingGradient"}, {"RuleName": "ExplodingTensor"},
         {"RuleName": "LossNotDecreasing", "RuleParameters": {"mode": "GLOBAL"}}]


def write_trials(n: int, steps: int) -> list[str]:
    import numpy as np

    from _support import write_trial

    rng = np.random.default_rng(0)

    def one(i: int) -> str:
        data = {s: {"gradient/fc1.weight": rng.normal(size=(16, 8)).astype("float32"),
                    "gradient/fc2.weight": rng.normal(size=(8,)).astype("float32"),
                    "loss": np.float32(1.0 / (s + 1))} for s in range(steps)}
        return write_trial(f"s3://{BUCKET}/jobs/job{i:03d}", data,
                           collections={"gradients": ["gradient/"], "losses": ["loss"]})

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def clear_state(client, n: int) -> None:
    for prefix in ("mltrace_watch/", "mltrace_rules/"):
        for i in range(n):
            listing = client.list_objects_v2(Bucket=BUCKET, Prefix=f"jobs/job{i:03d}/{prefix}")
            for obj in listing.get("Contents", []):
                client.delete_object(Bucket=BUCKET, Key=obj["Key"])


def time_watcher(executor, cap: int) -> dict:
    from mltrace.watch import parse_watch_rules
    from mltrace.watch.scheduling import Scheduler
    from mltrace.watch.service import Watcher

    watcher = Watcher(f"s3://{BUCKET}/jobs", parse_watch_rules(RULES),
                      Scheduler(executor, cap), poll_interval=1.0)
    start = time.perf_counter()
    stats = watcher.run(exit_when_done=True)
    wall = time.perf_counter() - start
    bad = [o for o in stats.outcomes if o.status != "finished"]
    if bad:
        raise SystemExit(f"{len(bad)} executions did not finish: {bad[0]}")
    return {"wall_s": wall, "executions": len(stats.outcomes), "trials": stats.trials}


def start_ray(cpus: int, env: dict) -> tuple[subprocess.Popen, str, str]:
    from _support import free_port, tail, wait_until

    temp = tempfile.mkdtemp(prefix="mlt-rayb-")
    port = free_port()
    log = os.path.join(temp, "head.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block",
             f"--port={port}", f"--num-cpus={cpus}", "--object-store-memory=78643200",
             "--include-dashboard=false", "--disable-usage-stats", "--node-ip-address=127.0.0.2",
             "--dashboard-agent-listen-port=0", f"--ray-client-server-port={free_port()}",
             f"--temp-dir={temp}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
    wait_until(lambda: "Ray runtime started" in tail(log, 100000), 120, "ray head", proc, log)
    return proc, f"127.0.0.2:{port}", temp


def empty_task_ms(runs: int = 30) -> float:
    import ray

    @ray.remote(num_cpus=0.5)
    def nothing() -> None:
        return None

    ray.get(nothing.remote())
    start = time.perf_counter()
    for _ in range(runs):
        ray.get(nothing.remote())
    return (time.perf_counter() - start) / runs * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--cap", type=int, default=2, help="pool size = Ray CPUs = concurrent rules")
    p.add_argument("--rounds", type=int, default=1,
                   help="pool and Ray runs, interleaved; the best of each is reported")
    args = p.parse_args()
    protocol.warn_if_busy()
    machine = protocol.machine()

    from _support import SeaweedS3, stop

    root = tempfile.mkdtemp(prefix="mlt-bench-watch-")
    s3 = SeaweedS3(root)
    s3.start()
    env = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.access_key,
           "AWS_SECRET_ACCESS_KEY": s3.secret_key, "AWS_DEFAULT_REGION": "us-east-1",
           "RAY_USAGE_STATS_ENABLED": "0"}
    os.environ.update(env)
    ray_proc = None
    try:
        client = s3.client()
        client.create_bucket(Bucket=BUCKET)
        load0 = protocol.load_average()
        t0 = time.perf_counter()
        write_trials(args.trials, args.steps)
        write_s = time.perf_counter() - t0
        print(f"wrote {args.trials} trials x {args.steps} steps in {write_s:.1f} s", flush=True)

        from mltrace.watch.executors import LocalPoolExecutor
        from mltrace.watch.ray_executor import RayExecutor

        ray_proc, address, ray_temp = start_ray(args.cap, dict(os.environ))
        empty_ms = 0.0

        def pool_run() -> dict:
            clear_state(client, args.trials)
            result = time_watcher(LocalPoolExecutor(args.cap), args.cap)
            print(f"local pool: {result}", flush=True)
            return result

        def ray_run() -> dict:
            nonlocal empty_ms
            clear_state(client, args.trials)
            ray_exec = RayExecutor(address, num_cpus=1.0)
            empty_ms = empty_ms or empty_task_ms()
            result = time_watcher(ray_exec, args.cap)  # shuts the driver down
            print(f"ray: {result}", flush=True)
            return result

        # interleaved, so that the machine's load hits both alike
        measured = protocol.interleaved({"pool": pool_run, "ray": ray_run}, args.rounds,
                                        warmup=False)
        runs = {name: m.runs for name, m in measured.items()}
        pool = min(runs["pool"], key=lambda r: r["wall_s"])
        ray_res = min(runs["ray"], key=lambda r: r["wall_s"])
    finally:
        if ray_proc is not None:
            stop(ray_proc, timeout=5)
            shutil.rmtree(ray_temp, ignore_errors=True)
        s3.stop()
        shutil.rmtree(root, ignore_errors=True)
    n = pool["executions"]
    rows = [("local pool", pool), ("Ray", ray_res)]
    print(f"\n{args.trials} finished trials x {args.steps} steps on S3, {len(RULES)} rules each "
          f"({n} executions), {args.cap} at once; load {load0:.1f} -> {protocol.load_average():.1f}; "
          f"commit {machine['commit']}")
    print(f"{'executor':<12} {'wall s':>8} {'exec/s':>8} {'trials/min':>11} {'vs pool':>8}")
    for name, r in rows:
        print(f"{name:<12} {r['wall_s']:>8.1f} {r['executions'] / r['wall_s']:>8.2f} "
              f"{args.trials / r['wall_s'] * 60:>11.1f} {r['wall_s'] / pool['wall_s']:>7.2f}x")
    per_task = (ray_res["wall_s"] - pool["wall_s"]) / n * args.cap * 1000
    print(f"Ray's cost per execution (wall difference x {args.cap} slots / executions): "
          f"{per_task:.0f} ms; an empty Ray task's round trip: {empty_ms:.1f} ms")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"args": vars(args), "runs": runs, "ray_cost_ms": per_task,
                   "empty_task_ms": empty_ms, "write_s": write_s,
                   "machine": platform.platform(), "cpus": machine["cores"],
                   "measured_on": machine}, f, indent=1)


if __name__ == "__main__":
    main()
