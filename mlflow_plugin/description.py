"""The training run's description in MLflow (its ``mlflow.note.content`` tag, which the UI shows
as Markdown on the run's page): the trial, its steps per mode, its collections, what the
rules found, each finding in full with its global step and the mode's own step beside it, and
the trial's diagnosis once one was made (from the ``mltrace.diagnosis.*`` tags: diagnosis.py).

The hook's sink writes it when training ends; each rule execution rewrites it when it starts,
when its condition first holds and when it ends, so the page follows the rules live. Only the
part between mltrace's two markers is mltrace's: a description the user wrote stays as it is,
with mltrace's part below it.

Step numbers: a *global step* counts every step the hook saw, in every mode (the TensorBoard
tab's x axis, the MLflow metrics' step, a rule's ``first_step``); a *mode step* counts the steps
of one mode only (TRAIN step 200 can be global step 210 after 10 EVAL steps).
"""

from __future__ import annotations

import logging
from typing import Any

from mltrace import analysis
from mltrace.trials import Trial

from . import _keys, links
from .diagnosis import NONE, TAG_CAUSE, TAG_MESSAGE, TAG_ONSET, TAG_ORIGIN

logger = logging.getLogger(__name__)

NOTE_TAG = "mlflow.note.content"
START = "<!-- mltrace: this part is rewritten by mltrace -->"
END = "<!-- mltrace: end -->"
#: The training run's tags the "Diagnosis" section is made of (diagnosis.py sets them).
_DIAGNOSIS_TAGS = (TAG_CAUSE, TAG_MESSAGE, TAG_ONSET, TAG_ORIGIN)
#: Order of the findings: what needs a look first.
_ORDER = {"IssuesFound": 0, "Error": 1, "InProgress": 2, "NothingChecked": 3, "NoIssuesFound": 4}
#: A mark per rule status, in glyphs common fonts have (DejaVu, Liberation, system UI fonts;
#: emoji fonts are often missing on Linux): rule run names and the description lead with it.
STATUS_MARKS = {"IssuesFound": "✖", "NoIssuesFound": "✔", "NothingChecked": "∅", "Error": "⚠",
                "InProgress": "…"}


def findings_from_tags(tags: dict[str, str]) -> dict[str, dict[str, str]]:
    """``{rule: {status, first_step, message, run_id, ...}}`` from a training run's
    ``mltrace.rule.<Rule>.<field>`` tags."""
    found: dict[str, dict[str, str]] = {}
    prefix = _keys.RULE_TAG_PREFIX
    for key, value in tags.items():
        if key.startswith(prefix) and key.count(".") >= 3:
            rule, _, field = key[len(prefix):].rpartition(".")
            found.setdefault(rule, {})[field] = value
    return found


def step_text(trial: Trial | None, step: Any) -> str:
    """``global step 210 (EVAL step 10)``: a global step with its mode's own step beside it (only
    the global step when the trial cannot say, or the step is of no mode)."""
    try:
        number = int(step)
    except (TypeError, ValueError):
        return f"step {step}"
    mode, mode_step = trial.mode_modestep(number) if trial is not None else (None, None)
    if mode is None or mode_step is None or mode.name == "GLOBAL":
        return f"global step {number}"
    return f"global step {number} ({mode.name} step {mode_step})"


def _steps_text(trial: Trial, info: analysis.TrialOverview) -> str:
    """``TRAIN 6 (global 0..5), EVAL 3 (global 6..8 = EVAL 0..2)``: each mode's count of saved
    steps, as global steps and, where they differ, as the mode's own steps."""
    parts = []
    for mode, span in info.modes.items():
        if not span.count or span.first is None or span.last is None:
            continue
        try:
            first = trial.global_step(mode, span.first)
            last = trial.global_step(mode, span.last)
        except Exception:  # a mode name the trial does not take back: its own steps only
            first = last = None
        if first is None or last is None or (first, last) == (span.first, span.last):
            parts.append(f"{mode} {span.count} (global {span.first}..{span.last})")
        else:
            parts.append(f"{mode} {span.count} (global {first}..{last} = {mode} "
                         f"{span.first}..{span.last})")
    return ", ".join(parts) or "none yet"


def _cell(text: Any) -> str:
    """Text for a Markdown table cell: one line, pipes escaped, nothing cut."""
    return " ".join(str(text).split()).replace("|", "\\|") or " "


def training_description(trial: Trial | None, location: str,
                         findings: dict[str, dict[str, str]], experiment_id: str | None = None,
                         first_nonfinite: tuple[str, str] | None = None,
                         diagnosis: dict[str, str] | None = None) -> str:
    """mltrace's part of the description (Markdown between the markers): the first non-finite
    tensor (tensor, step) when the flight recorder saw one, the diagnosis (its
    ``mltrace.diagnosis.*`` tags) and the findings first (the UI folds long descriptions after a
    few lines), then the trial, its steps and collections."""
    out = [START]
    if first_nonfinite is not None:
        tensor, step = first_nonfinite
        out += [f"**First non-finite tensor: `{_cell(tensor).replace('`', '')}` at "
                f"{_cell(step_text(trial, step))}** (flight recorder)", ""]
    if diagnosis:
        out += diagnosis_section(trial, location, diagnosis)
    if not findings:
        out += ["#### mltrace: no rule has run on this trial yet", ""]
    else:
        fired = sum(f.get("status") == "IssuesFound" for f in findings.values())
        out += [f"#### mltrace: {fired} of {len(findings)} rules found issues", "",
                "| rule | status | first found at | message |", "|---|---|---|---|"]
        for rule, f in sorted(findings.items(),
                              key=lambda kv: (_ORDER.get(kv[1].get("status", ""), 9), kv[0])):
            status = f.get("status", "?")
            name = rule
            if f.get("run_id") and experiment_id:
                name = f"[{rule}]({links.run_page(experiment_id, f['run_id'])})"
            where = step_text(trial, f["first_step"]) if f.get("first_step") else "-"
            out.append(f"| {name} | {STATUS_MARKS.get(status, '')} {status} | {where} | "
                       f"{_cell(f.get('message') or '-')} |")
        out.append("")
    out.append(f"Trial: `{location}`")
    if trial is not None:
        info = analysis.trial_overview(trial)
        state = "training ended" if info.ended else "training in progress"
        out.append(f"Steps saved: {_steps_text(trial, info)}; {len(info.workers)} worker(s); "
                   f"{state}.")
        colls = ", ".join(f"{name} ({len(info.members[name])})" for name in info.collections
                          if info.members[name])
        out.append(f"Collections (tensors): {colls or 'none yet'}.")
    out.append("Steps are global steps (every step of every mode, the x axis of mltrace's "
               "metrics and TensorBoard tab); the mode's own step is in brackets.")
    out.append(END)
    return "\n".join(out)


def diagnosis_section(trial: Trial | None, location: str, tags: dict[str, str]) -> list[str]:
    """The "Diagnosis" section (Markdown lines) from a run's ``mltrace.diagnosis.*`` tags: the
    cause, the report's one line, the onset and the origin, and where the full report is."""
    cause = tags.get(TAG_CAUSE) or NONE
    out = ["#### Diagnosis" + (f": {_cell(cause)}" if cause != NONE else ""), "",
           _cell(tags.get(TAG_MESSAGE) or "-"), ""]
    onset, origin = tags.get(TAG_ONSET) or NONE, tags.get(TAG_ORIGIN) or NONE
    if onset != NONE or origin != NONE:
        out += [f"Onset: {_cell(step_text(trial, onset)) if onset != NONE else '-'}; origin: "
                f"`{_cell(origin).replace('`', '')}`", ""]
    out += [f"The full report: `mltrace diagnose {location}`", ""]
    return out


def merged(existing: str | None, ours: str) -> str:
    """``existing`` with mltrace's part replaced by ``ours`` (or ``ours`` added below the user's
    text)."""
    text = existing or ""
    start, end = text.find(START), text.find(END)
    if start >= 0 and end > start:
        return text[:start] + ours + text[end + len(END):]
    return f"{text.rstrip()}\n\n{ours}" if text.strip() else ours


def update_training_description(client: Any, run_id: str, trial: Trial | None = None) -> str:
    """Rewrite mltrace's part of the description of training run ``run_id``, from its rule tags
    and its trial (``trial``, else the one its ``mltrace.trial`` tag names, when readable).

    Returns:
        the new description.
    """
    run = client.get_run(run_id)
    tags = dict(run.data.tags)
    location = tags.get(_keys.TAG_TRIAL) or (trial.path if trial is not None else "?")
    if trial is None and location != "?":
        try:
            from mltrace.trials import create_trial

            trial = create_trial(location, timeout=0)
        except Exception as exc:  # the trial elsewhere or gone: the findings still show
            logger.debug("description of run %s without its trial: %s", run_id, exc)
    first = (tags.get(_keys.TAG_FIRST_NONFINITE_TENSOR), tags.get(_keys.TAG_FIRST_NONFINITE_STEP))
    diagnosis = {k: tags[k] for k in _DIAGNOSIS_TAGS if k in tags}
    ours = training_description(trial, location, findings_from_tags(tags),
                                run.info.experiment_id,
                                (first[0], first[1] or "?") if first[0] else None, diagnosis)
    text = _keys.tag_value(merged(tags.get(NOTE_TAG), ours))
    if text != tags.get(NOTE_TAG):
        client.set_tag(run_id, NOTE_TAG, text)
    return text
