"""The benchmarks' one way of measuring: settings run interleaved, medians reported with their
spread, the machine's load checked before and after, and the machine and commit named.

Why interleaved: on a 2-core machine another process (a test suite, a package install) moves
every setting's time; run k of each setting in turn, each sees the same machine state, so the
ratios between settings stay honest even when the absolute times drift. A warm-up run of each
setting comes first and is not counted (first-call costs: imports, allocator, caches).

The bench scripts import this module as ``protocol`` (a script's own folder is first on
``sys.path``). It imports only the standard library, so that it loads in every venv.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: A one-minute load average above this many runnable processes per core says that something
#: else runs on the machine: the figures are then marked, not trusted.
BUSY_LOAD_PER_CORE = 0.5


@dataclass
class Measured:
    """The measured runs of one setting (its warm-up apart), in the unit the setting returns."""

    runs: list[float] = field(default_factory=list)
    warmup: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def spread(self) -> tuple[float, float]:
        """(smallest, largest) measured run."""
        return min(self.runs), max(self.runs)

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.spread[0], "max": self.spread[1],
                "runs": list(self.runs), "warmup": self.warmup}


def interleaved(settings: Mapping[str, Callable[[], float]], runs: int,
                warmup: bool = True) -> dict[str, Measured]:
    """Call each setting once to warm up (unless ``warmup`` is False), then ``runs`` times, the
    settings in turn (run k of each before run k+1 of any); a call returns its measurement.

    Round k begins with the k-th setting (the order rotates), so that no setting always runs
    right after the same other one. On a 2-vCPU VM that matters: in five rounds of 40 steps of
    the nanoGPT model, mltrace saving raw tensors every step (6.5 MB a step) took 1.1 ms a step
    more, and its writer process twice the CPU time, when it was the first setting of a round
    to write files than when the same setting ran again right after it (the kernel's copies
    into the page cache were the writer's cost; fresh pages from the host, the likely cause)."""
    measured = {name: Measured() for name in settings}
    if warmup:
        for name, run in settings.items():
            measured[name].warmup = run()
    names = list(settings)
    for k in range(runs):
        for i in range(len(names)):
            name = names[(k + i) % len(names)]
            measured[name].runs.append(settings[name]())
    return measured


def added(measured: Mapping[str, Measured], baseline: str) -> dict[str, float]:
    """Each setting's median minus the baseline's (the time a setting adds to it)."""
    base = measured[baseline].median
    return {name: m.median - base for name, m in measured.items() if name != baseline}


def added_runs(measured: Mapping[str, Measured], baseline: str, name: str) -> list[float]:
    """Run k of ``name`` minus run k of the baseline, for every k: what the setting added in
    each round (its spread says how far one round's ratio can be trusted)."""
    return [a - b for a, b in zip(measured[name].runs, measured[baseline].runs)]


def load_per_core() -> float:
    """The one-minute load average per core (0.0 where the OS does not say)."""
    return load_average() / (os.cpu_count() or 1)


def commit() -> str:
    """The checked-out commit (with ``+`` when the tree has changes), or "unknown"."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev + ("+" if dirty else "")) or "unknown"


def cpu_model() -> str:
    """The processor's model name (Linux), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the figures came from: processor, cores, Python, the commit, the load before."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "executable": sys.executable, "commit": commit(),
            "load_per_core": round(load_per_core(), 2), **(extra or {})}


def step_groups(settings: list[str], long: Iterable[str], steps: int, long_steps: int, runs: int,
                workdir: str, batches: Callable[[int], Any],
                one_run: Callable[[str, Any, str], float]) -> dict[str, Measured]:
    """The training-step benchmarks' two interleaved groups: the settings not in ``long`` over
    ``batches(steps)``, then those in ``long``, with ``none`` again as their baseline (reported
    as ``none_long``), over ``batches(long_steps)``. ``one_run(setting, batches, out_dir)``
    times one run; each gets an out_dir of its own under ``workdir``."""
    long = set(long)
    counter = iter(range(1_000_000))

    def run(setting: str, batches: Any) -> Callable[[], float]:
        return lambda: one_run(setting, batches, os.path.join(workdir, f"{setting}_{next(counter)}"))

    short = [s for s in settings if s not in long]
    longer = [s for s in settings if s in long]
    results: dict[str, Measured] = {}
    if short:
        some = batches(steps)
        results.update(interleaved({s: run(s, some) for s in short}, runs))
    if longer:
        some = batches(long_steps)
        group = interleaved({s: run(s, some) for s in ["none", *longer]}, runs)
        results.update({("none_long" if s == "none" else s): m for s, m in group.items()})
    return results


def print_step_report(what: str, model: Any, config: Any, results: Mapping[str, Measured],
                      ratios: list[str], as_json: bool, extra: Mapping[str, Any] | None = None) -> None:
    """The end of a training-step benchmark: the machine and the model (``what``, its size from
    ``model``'s parameters), each setting's median ms/step with its spread, then ``ratios``; or
    all of it as one JSON object."""
    params = list(model.parameters())
    env = machine({**(extra or {}), "model": f"{config}", "parameters": sum(p.numel() for p in params),
                   "tensors": len(params), "load_per_core_after": round(load_per_core(), 2)})
    if as_json:
        print(json.dumps({"results": {k: m.as_dict() for k, m in results.items()},
                          "ratios": ratios, "env": env}))
        return
    print(f"{what}, {env['parameters']} parameters in {env['tensors']} tensors; "
          f"commit {env['commit']}, {env['cpu']}, load {env['load_per_core']}/core before, "
          f"{env['load_per_core_after']} after")
    for name, m in results.items():
        lo, hi = m.spread
        print(f"{name:18s} {m.median:8.2f} ms/step (runs {lo:.2f}..{hi:.2f})")
    for line in ratios:
        print(line)


def warn_if_busy(stream: Any = sys.stderr) -> bool:
    """Print a warning when the machine looks busy beyond the benchmark's own process (one
    runnable process is the benchmark); True if it does."""
    cores = os.cpu_count() or 1
    load = max(0.0, load_per_core() * cores - 1.0) / cores
    if load > BUSY_LOAD_PER_CORE:
        print(f"warning: load average {load:.2f} per core: something else runs on this machine; "
              "ratios measured now are not to be trusted", file=stream)
        return True
    return False


def timed(run: Callable[[], Any]) -> float:
    """Seconds ``run()`` takes (perf_counter)."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


# -- helpers several scripts share (added with the port of the bench scripts) ----------------------

def pick(measured: Mapping[str, Measured], key: Any) -> dict[str, Measured]:
    """Where a setting's run returns several figures (a mapping or a tuple): each setting's runs,
    and warm-up, of the one figure ``key``."""
    return {name: Measured([run[key] for run in m.runs],
                           None if m.warmup is None else m.warmup[key])
            for name, m in measured.items()}


def paired(measured: Mapping[str, Measured], baseline: str, name: str) -> list[float]:
    """Run k of ``name`` divided by run k of the baseline, for every k: the two ran seconds
    apart, so a machine that slows down for a while moves both sides of each ratio alike."""
    return [a / b for a, b in zip(measured[name].runs, measured[baseline].runs)]


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (a script's figures that are not runs of one setting)."""
    return statistics.median(values)


def load_average() -> float:
    """The one-minute load average of the whole machine (0.0 where the OS does not say); the
    scripts record it before and after their runs."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0
