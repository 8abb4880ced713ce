"""``mltrace watch`` diagnoses a trial that broke (mltrace.diagnosis), once, where it reads it.

After a rule execution has run on a trial (in the pool worker or Ray worker that opened it), the
execution looks for trouble and, if the trial holds no diagnosis that covers it, runs
``diagnose(trial)`` and ``publish``: the report goes into the trial
(``mltrace_diagnosis/<worker>.json``), the log and the diagnosis listeners (the MLflow side tags
the training run). ``mltrace watch --no-diagnose`` turns it off.

- **Trouble**: a flight-recorder dump that no person asked for (trigger other than ``manual``)
  or a rule result that fired (IssuesFound): the execution's own or any stored in the trial.
  The trouble step is the newest of the dumps' steps and the fired results' first firings.
- **Up to date** (nothing is diagnosed): a stored report has read the steps through the trouble
  step (its ``steps.last`` is at or after it), or the trial has no step after the last one a
  stored report read (a new diagnosis would read nothing more). A report explains the trial's
  first anomaly, so later trouble in steps it has read would not change it; trouble after them,
  in steps the trial has since saved, is diagnosed again.
- **Once**: the executions of one trial end together when its training ends. The first that
  finds the trial needs a diagnosis claims it (a token in ``mltrace_watch/diagnosis.claim``,
  read back after CLAIM_SETTLE seconds: the last writer wins), looks again whether it is still
  needed, and deletes the claim when done; the others leave the trial to it. A claim older than
  CLAIM_TTL (its worker died while diagnosing) is taken over.

Never raises: a diagnosis that fails is a warning and the execution's outcome stays what the
rule made it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mltrace.diagnosis import diagnose
from mltrace.diagnosis.publish import publish
from mltrace.diagnosis.stored import read_reports
from mltrace.format import paths
from mltrace.format.flight_record import read_records
from mltrace.rules.results import ISSUES_FOUND, RuleResult, read_results

if TYPE_CHECKING:
    from mltrace.storage import Storage
    from mltrace.trials import Trial

logger = logging.getLogger(__name__)

#: What a diagnosis pass did (kept in the execution's outcome, ``Outcome.diagnosis``).
NO_TROUBLE = "no trouble"
UP_TO_DATE = "up to date"
LEFT_TO_ANOTHER = "left to another execution"
PUBLISHED = "published"

#: The claim of the execution that diagnoses a trial (not ``.json``: no finished execution).
CLAIM_KEY = f"{paths.WATCH_STATE_DIR}/diagnosis.claim"
#: Seconds between writing a claim and reading it back (longer than the others' read-then-write).
CLAIM_SETTLE = 1.0
#: Seconds after which a claim that was never deleted is taken over.
CLAIM_TTL = 900.0


def trouble_step(storage: Storage, own: RuleResult | None = None) -> int | None:
    """The newest step of trouble in the trial of ``storage`` (see the module), or None.

    Args:
        storage: the trial's storage.
        own: the execution's own rule result, counted even if it could not be stored.
    """
    steps = [dump.step for record in read_records(storage) for dump in record.dumps
             if dump.trigger != "manual"]
    stored = read_results(storage)
    if own is not None and all(r.run_id != own.run_id for r in stored):
        stored.append(own)
    for result in stored:
        if result.status == ISSUES_FOUND and result.fired_steps:
            first = result.first_step if result.first_step is not None else min(result.fired_steps)
            steps.append(first)
    return max(steps) if steps else None


def read_through(reports: Sequence[dict[str, Any]]) -> int | None:
    """The last step any stored report read (``steps.last``), or None without a report."""
    lasts = [r["steps"]["last"] for r in reports
             if isinstance(r.get("steps"), dict) and isinstance(r["steps"].get("last"), int)]
    return max(lasts) if lasts else None


def up_to_date(read: int | None, trouble: int, last_step: int) -> bool:
    """True when a stored diagnosis covers the trouble (see the module).

    Args:
        read: the last step a stored report read (read_through), None without one.
        trouble: the trouble step (trouble_step).
        last_step: the trial's last saved step now.
    """
    return read is not None and (trouble <= read or last_step <= read)


def diagnose_trouble(trial: Trial, own: RuleResult | None = None) -> str:
    """Diagnose and publish ``trial`` if it shows trouble no stored report covers.

    Returns:
        what was done: NO_TROUBLE, UP_TO_DATE, LEFT_TO_ANOTHER, PUBLISHED, or ``failed: ...``
        (logged as a warning; never raises).
    """
    storage = trial.storage
    try:
        trouble = trouble_step(storage, own)
        if trouble is None:
            return NO_TROUBLE
        if _covered(trial, trouble):
            return UP_TO_DATE
        token = _claim(storage)
        if token is None:
            return LEFT_TO_ANOTHER
        try:
            if _covered(trial, trouble):  # another execution published while we claimed
                return UP_TO_DATE
            report = diagnose(trial)
            publish(storage, report)
            return PUBLISHED
        finally:
            _release(storage, token)
    except Exception as exc:  # noqa: BLE001 - a diagnosis never fails the watch
        why = f"{type(exc).__name__}: {exc}"
        logger.warning("could not diagnose %s after its rule ran: %s", trial.path, why)
        return f"failed: {why}"


def _covered(trial: Trial, trouble: int) -> bool:
    steps = trial.steps(show_incomplete_steps=True)
    return up_to_date(read_through(read_reports(trial.storage)), trouble,
                      steps[-1] if steps else -1)


def _claim(storage: Storage) -> str | None:
    """This execution's claim token if it holds the claim now, else None (see the module)."""
    held = _read_claim(storage)
    if held is not None and time.time() - held.get("time", 0.0) < CLAIM_TTL:
        return None
    token = uuid.uuid4().hex
    claim = {"token": token, "time": time.time(), "host": f"{socket.gethostname()}:{os.getpid()}"}
    storage.write(CLAIM_KEY, json.dumps(claim).encode())
    time.sleep(CLAIM_SETTLE)
    held = _read_claim(storage)
    return token if held is not None and held.get("token") == token else None


def _read_claim(storage: Storage) -> dict[str, Any] | None:
    try:
        claim = json.loads(storage.read(CLAIM_KEY))
    except (FileNotFoundError, ValueError):
        return None
    return claim if isinstance(claim, dict) else None


def _release(storage: Storage, token: str) -> None:
    """Delete the claim if it is still ``token``'s (a warning if it cannot be)."""
    try:
        held = _read_claim(storage)
        if held is not None and held.get("token") == token:
            storage.delete(CLAIM_KEY)
    except Exception as exc:  # noqa: BLE001 - a claim left behind expires after CLAIM_TTL
        logger.warning("could not delete %s/%s: %s", getattr(storage, "uri", ""), CLAIM_KEY, exc)
