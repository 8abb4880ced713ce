"""Step numbers across a preempted job's restarts (smdebug's checkpoint support).

A job on spot or preemptible instances saves checkpoints into a folder, and when it is restarted
it loads the newest one and trains on from there. Its hook must then number steps after the
step that checkpoint was taken at, not from 0 again (which would replace the first run's steps
with different ones). As smdebug 1.0.34 did (core/state_store.py), with the same files, so a job
first run under smdebug resumes under mltrace:

* the checkpoint configuration file, named by ``CHECKPOINT_CONFIG_FILE_PATH`` (default
  ``/opt/ml/input/config/checkpointconfig.json``, where SageMaker writes it), gives the
  checkpoint folder as ``{"LocalPath": "/opt/ml/checkpoints"}``;
* at each step boundary the hook looks at the files in that folder; when one appeared or
  changed since the last look, it appends its state (the global step just done, each mode's
  step, the last step it saved, a counter of runs) to ``metadata.json`` in that folder, beside
  the checkpoint just written;
* a hook built when ``metadata.json`` holds states continues from the latest one: its first
  step is the step after the one seen when the newest checkpoint appeared. Steps the framework
  numbers itself (XGBoost's boosting rounds, which continue from a checkpointed model) keep
  their numbers, as smdebug's XGBoost hook kept them.

Without a configuration file nothing is looked at, so a job that does not checkpoint pays one
``os.path.exists`` per hook. mltrace also notices a checkpoint rewritten in place with the same
size (smdebug compared names and sizes only, so ``torch.save`` of the same model each epoch went
unnoticed), and writes ``metadata.json`` atomically.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from mltrace.capture.clock import StepClock
from mltrace.modes import ModeKeys

logger = logging.getLogger("mltrace.capture.hook")

CONFIG_ENV_VAR = "CHECKPOINT_CONFIG_FILE_PATH"
DEFAULT_CONFIG_FILE = "/opt/ml/input/config/checkpointconfig.json"
DIR_KEY = "LocalPath"
STATES_FILE = "metadata.json"
# The keys of a state, as smdebug wrote them.
TRAINING_RUN = "training-run"
STEP_SAVED = "latest-global-step-saved"
STEP_SEEN = "latest-global-step-seen"
MODE_STEPS = "latest-mode-step"


def _checkpoint_files(folder: str) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of every checkpoint file under ``folder`` (not the states file, nor
    SageMaker's upload markers), sorted."""
    found = []
    for parent, _, files in os.walk(folder):
        for name in files:
            if name == STATES_FILE or "sagemaker-uploaded" in name:
                continue
            path = os.path.join(parent, name)
            try:
                info = os.stat(path)
            except OSError:  # removed while we looked
                continue
            found.append((path, info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


class CheckpointState:
    """The states kept beside a job's checkpoints.

    Args:
        folder: the checkpoint folder (from the checkpoint configuration file).
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.states_file = os.path.join(folder, STATES_FILE)
        self.states: list[dict[str, Any]] = self._read_states()
        last = self.latest
        self.training_run = 0 if last is None else int(last[TRAINING_RUN]) + 1
        self.last_saved_step: int | None = None if last is None else last.get(STEP_SAVED)
        #: True until the restored state was applied to the clock (at the first counted step).
        self.to_restore = last is not None
        self._seen = _checkpoint_files(folder)

    @classmethod
    def from_env(cls) -> CheckpointState | None:
        """The job's checkpoint state if a checkpoint configuration file names a folder."""
        path = os.environ.get(CONFIG_ENV_VAR) or DEFAULT_CONFIG_FILE
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as exc:
            logger.warning("checkpoint configuration %s cannot be read (%s): step numbers will "
                           "start at 0 if this job was restarted", path, exc)
            return None
        folder = config.get(DIR_KEY) if isinstance(config, dict) else None
        if not isinstance(folder, str) or not folder:
            logger.warning("checkpoint configuration %s has no %r (the checkpoint folder): step "
                           "numbers will start at 0 if this job was restarted", path, DIR_KEY)
            return None
        return cls(folder)

    def _read_states(self) -> list[dict[str, Any]]:
        try:
            with open(self.states_file, encoding="utf-8") as f:
                states = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            logger.warning("%s cannot be read (%s): step numbers start at 0", self.states_file, exc)
            return []
        valid = [s for s in states if isinstance(s, dict) and isinstance(s.get(STEP_SEEN), int)
                 and isinstance(s.get(MODE_STEPS), dict)] if isinstance(states, list) else []
        return sorted(valid, key=lambda s: s[STEP_SEEN])

    @property
    def latest(self) -> dict[str, Any] | None:
        """The state with the highest step seen, or None."""
        return self.states[-1] if self.states else None

    def restore(self, clock: StepClock) -> None:
        """Set ``clock`` to the latest state: the next step is the one after it."""
        self.to_restore = False
        last = self.latest
        if last is None:
            return
        for name, step in last[MODE_STEPS].items():
            if name in ModeKeys.__members__ and isinstance(step, int):
                clock.mode_steps[ModeKeys[name]] = step
        clock.step = clock.mode_steps[ModeKeys.GLOBAL] = int(last[STEP_SEEN])
        logger.info("resuming from the checkpoint state in %s: the next step is %d (run %d)",
                    self.states_file, clock.step + 1, self.training_run)

    def step_boundary(self, clock: StepClock, counted: bool, step_saved: bool) -> None:
        """At a step boundary: before the first counted step, continue a restarted job's steps
        (steps numbered by the framework, XGBoost's rounds, keep theirs); between steps, note
        whether the step that ended saved something and record the state when a new checkpoint
        appeared."""
        if step_saved and clock.started:
            self.last_saved_step = clock.step
        if self.to_restore and not clock.started:
            if counted:
                self.restore(clock)
            self.to_restore = False
            return
        self.at_boundary(clock)

    def at_boundary(self, clock: StepClock) -> None:
        """Between two steps: record the state if a checkpoint appeared or changed."""
        files = _checkpoint_files(self.folder)
        if files == self._seen:
            return
        self._seen = files
        if not files:
            return
        self.states.append({
            TRAINING_RUN: self.training_run,
            STEP_SAVED: self.last_saved_step,
            STEP_SEEN: clock.step,
            MODE_STEPS: {mode.name: step for mode, step in clock.mode_steps.items()},
        })
        tmp = f"{self.states_file}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.states, f)
            os.replace(tmp, self.states_file)
        except OSError as exc:  # a full disk: the checkpoint itself is the user's concern
            logger.warning("could not record the step of the new checkpoint in %s (%s): a restart "
                           "from it would number steps from an earlier state", self.states_file, exc)


__all__ = ["CheckpointState", "CONFIG_ENV_VAR", "DEFAULT_CONFIG_FILE"]
