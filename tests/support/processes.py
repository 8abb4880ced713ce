"""Processes the fault tests look for in /proc: the writer processes a training process
started, also once it died (Linux only, as these tests are)."""

from __future__ import annotations

import os
import time

from mltrace.writer.process import CHILD_PROGRAM


def child_pids() -> list[int]:
    """The processes this one started that still run: /proc/<pid>/stat's parent field (the
    kernel's per-task ``children`` lists need CONFIG_PROC_CHILDREN)."""
    me, pids = os.getpid(), []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            pids.append(pid)
    return pids


def writer_processes(root: str) -> list[int]:
    """The trial writer processes (mltrace/writer/child.py) that write the trial in ``root``,
    whoever their parent is now: one whose training process was killed outlives it while it
    writes what it was handed, and then belongs to init."""
    root, pids = os.path.realpath(root), []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [os.fsdecode(arg) for arg in f.read().split(b"\0")]
        except OSError:
            continue
        at = argv.index(CHILD_PROGRAM) + 1 if CHILD_PROGRAM in argv else len(argv)
        if at < len(argv) and os.path.realpath(argv[at]) == root:
            pids.append(pid)
    return pids


def _pids() -> list[int]:
    """Every process's id, from /proc's numbered entries."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def wait_for_writers(root: str, timeout: float = 30.0) -> bool:
    """Return once no writer process writes the trial in ``root`` (see writer_processes); True
    if one was still running when called."""
    deadline = time.monotonic() + timeout
    found = bool(pids := writer_processes(root))
    while pids:
        assert time.monotonic() < deadline, f"writer processes {pids} of {root} still run"
        time.sleep(0.005)
        pids = writer_processes(root)
    return found
