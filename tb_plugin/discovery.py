"""Finding trials for the plugin and for ``mltrace tensorboard``, without ever walking into one.

A trial is a folder that holds ``collections/<n>/<worker>_collections.json``. Trials are found:

* under the plugin's own flag ``--mltrace_logdir`` (a trial, or a folder of trials; local or any
  scheme an installed mltrace storage backend handles, such as s3://), and
* one level above a ``tensorboard/`` export under TensorBoard's ``--logdir``: the logdir itself
  inside an export (``<trial>/tensorboard[/TRAIN]``), exports below it, and links to exports
  (``mltrace tensorboard`` builds a folder of links so that TensorBoard's loader reads the
  exports only), plus the run names TensorBoard's data provider reports for remote logdirs.

Local scans go at most ``MAX_DEPTH`` folders deep and never enter a trial, a ``tensorboard/``
folder or a hidden folder, so a logdir that also holds ordinary TensorBoard runs costs little.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mltrace.format import flight_record, paths
from mltrace.storage import is_remote, open_storage

logger = logging.getLogger(__name__)

MAX_DEPTH = 4
_COLLECTIONS_KEY = re.compile(r"^(?:(.*)/)?collections/\d+/[^/]+_collections\.json$")
_TRIAL_PARTS = frozenset({"events", "index", "collections", paths.RULE_RESULTS_DIR,
                          flight_record.RECORD_DIR})


@dataclass(frozen=True)
class TrialRef:
    """A trial found: the name the plugin shows and the location it opens."""

    name: str
    location: str


def is_local_trial(path: str) -> bool:
    """True if the local folder ``path`` holds a collections file (a trial's first file)."""
    folder = os.path.join(path, *paths.COLLECTIONS_DIR.split("/"))
    try:
        return any(n.endswith("_collections.json") for n in os.listdir(folder))
    except OSError:
        return False


def _local_scan(root: str, max_depth: int = MAX_DEPTH) -> list[tuple[str, str]]:
    """(relative name, real path) of the trials at or below the local folder ``root``; a link
    to a ``tensorboard/`` export stands for the trial above that export."""
    found: list[tuple[str, str]] = []
    real_root = os.path.realpath(root)
    if is_local_trial(real_root):
        return [("", real_root)]
    if os.path.basename(real_root) == paths.TENSORBOARD_DIR and is_local_trial(
        os.path.dirname(real_root)
    ):
        return [("", os.path.dirname(real_root))]
    stack = [("", real_root, 0)]
    seen = {real_root}
    while stack:
        rel, folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            name = f"{rel}/{entry.name}" if rel else entry.name
            real = os.path.realpath(entry.path)
            if real in seen:
                continue
            seen.add(real)
            if is_local_trial(real):
                found.append((name, real))
            elif os.path.basename(real) == paths.TENSORBOARD_DIR:
                if is_local_trial(os.path.dirname(real)):
                    found.append((name if entry.is_symlink() else rel, os.path.dirname(real)))
            elif depth + 1 < max_depth and entry.name not in _TRIAL_PARTS:
                stack.append((name, real, depth + 1))
    return sorted(found)


def _remote_scan(root: str) -> list[tuple[str, str]]:
    """Trials at or below a remote location, through mltrace's storage backend for its scheme."""
    storage = open_storage(root)
    prefixes = set()
    for key in storage.list(""):
        match = _COLLECTIONS_KEY.match(key)
        if match:
            prefixes.add(match.group(1) or "")
    base = root.rstrip("/")
    return sorted((p, f"{base}/{p}" if p else base) for p in prefixes)


def find_trials(root: str) -> list[tuple[str, str]]:
    """(name relative to ``root``, location) of every trial at or below ``root``."""
    if is_remote(root):
        return _remote_scan(root)
    if root.startswith("file://"):
        root = root[len("file://") :]
    return _local_scan(os.path.expanduser(root))


def trial_above_run(logdir: str, run: str) -> str | None:
    """The trial one level above the ``tensorboard/`` folder holding TensorBoard run ``run``."""
    full = logdir.rstrip("/") + ("/" + run if run not in ("", ".") else "")
    if not is_remote(full):
        full = os.path.realpath(full)
    parts = full.replace(os.sep, "/").split("/")
    if paths.TENSORBOARD_DIR not in parts:
        return None
    cut = len(parts) - 1 - parts[::-1].index(paths.TENSORBOARD_DIR)
    return "/".join(parts[:cut]) or None


def discover(
    mltrace_logdirs: Sequence[str], logdir: str | None, run_names: Sequence[str] = ()
) -> list[TrialRef]:
    """Every trial the plugin shows, each once, with unique names.

    Args:
        mltrace_logdirs: values of ``--mltrace_logdir`` (trials or folders of trials).
        logdir: TensorBoard's ``--logdir`` (may be None or empty, e.g. with ``--logdir_spec``).
        run_names: TensorBoard's run names, when a data provider reported them.
    """
    candidates: list[tuple[str, str]] = []
    for root in mltrace_logdirs:
        try:
            for rel, location in find_trials(root):
                candidates.append((rel or _basename(location), location))
        except Exception as exc:  # one unreadable root must not hide the others
            logger.warning("mltrace: cannot look for trials in %s: %s", root, exc)
    if logdir:
        above = trial_above_run(logdir, "")
        if above and _is_trial(above):
            candidates.append((_basename(above), above))
        if not is_remote(logdir):
            for rel, location in _local_scan(os.path.expanduser(logdir)):
                candidates.append((rel or _basename(location), location))
        for run in run_names:
            trial = trial_above_run(logdir, run)
            if trial and not any(loc == trial for _, loc in candidates) and _is_trial(trial):
                rel = (
                    run.split("/" + paths.TENSORBOARD_DIR)[0]
                    if ("/" + paths.TENSORBOARD_DIR) in "/" + run
                    else ""
                )
                candidates.append((rel.strip("/") or _basename(trial), trial))
    refs: list[TrialRef] = []
    names: set[str] = set()
    locations: set[str] = set()
    for name, location in candidates:
        if location in locations:
            continue
        locations.add(location)
        unique, n = name, 2
        while unique in names:
            unique, n = f"{name} ({n})", n + 1
        names.add(unique)
        refs.append(TrialRef(unique, location))
    return refs


def _is_trial(location: str) -> bool:
    if not is_remote(location):
        return is_local_trial(location)
    try:
        return bool(open_storage(location).list(paths.COLLECTIONS_DIR))
    except Exception:
        return False


def _basename(location: str) -> str:
    return location.rstrip("/").rsplit("/", 1)[-1] or location
