"""What happens when a rule's condition is met: stop training, dump the flight recorder, notify.

``action_str`` is JSON: one object or a list of them (smdebug's form, case-insensitive)::

    {"name": "stoptraining"}                      write the stop signal into the trial: the
                                                  hook ends training at its next step boundary
    {"name": "dumpflightrecorder"}                write a dump request into the trial: hooks
                                                  with a flight recorder write the steps it
                                                  holds (trigger "rule", the rule's message);
                                                  once per run of consecutive firings
    {"name": "notify", "webhook": "https://..."}  log a warning; POST a JSON message if a URL is
                                                  given

smdebug's SageMaker-only actions ("sms", "email" through SNS, and "training_job_prefix") have
no service behind them here: they are accepted and logged as notifications, with a note.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from typing import TYPE_CHECKING, Any

from mltrace.exceptions import MltraceValueError
from mltrace.format import flight_record, paths

if TYPE_CHECKING:
    from mltrace.rules.rule import Rule

logger = logging.getLogger(__name__)


class Action:
    """One action; ``invoke`` runs when the rule's condition holds at ``step``."""

    def invoke(self, rule: Rule, step: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class StopTraining(Action):
    """Write the stop signal file into the base trial's location."""

    def invoke(self, rule: Rule, step: int) -> None:
        signal = {"rule": rule.rule_name, "step": step, "message": rule.last_message or "",
                  "time": time.time()}
        try:
            rule.base_trial.storage.write(paths.STOP_SIGNAL_FILE, json.dumps(signal).encode())
            logger.warning("rule %s fired at step %d: asked training at %s to stop",
                           rule.rule_name, step, rule.base_trial.path)
        except Exception as exc:  # the rule's verdict stands even if the signal cannot be written
            logger.error("rule %s could not write the stop signal into %s: %s",
                         rule.rule_name, rule.base_trial.path, exc)


class DumpFlightRecorder(Action):
    """Write a flight recorder dump request into the base trial's location
    (``mltrace.format.flight_record.write_request``); a hook without a recorder ignores it.

    One request per episode: a rule that fires at consecutive evaluations asks at the first of
    them only (the recorder keeps recording at full resolution after a dump), and again once it
    has fired after an evaluation where it did not.
    """

    def invoke(self, rule: Rule, step: int) -> None:
        earlier = rule.evaluations
        if earlier and earlier[-1] == (step, True):  # this evaluation (recorded before actions)
            earlier = earlier[:-1]
        if earlier and earlier[-1][1]:
            logger.info("rule %s fired again at step %d: the flight recorder dump it asked for "
                        "covers it", rule.rule_name, step)
            return
        try:
            request = flight_record.write_request(rule.base_trial.storage,
                                                  rule.last_message or "", rule=rule.rule_name,
                                                  step=step)
            logger.warning("rule %s fired at step %d: asked training at %s to dump its flight "
                           "recorder (request %s)", rule.rule_name, step, rule.base_trial.path,
                           request.id)
        except Exception as exc:  # the rule's verdict stands even if the request cannot be written
            logger.error("rule %s could not write the flight recorder request into %s: %s",
                         rule.rule_name, rule.base_trial.path, exc)


class Notify(Action):
    """Log the finding (and POST it to a webhook URL when one is given)."""

    def __init__(self, webhook: str | None = None, note: str | None = None) -> None:
        self.webhook = webhook
        self.note = note

    def invoke(self, rule: Rule, step: int) -> None:
        text = f"rule {rule.rule_name} fired at step {step} on {rule.base_trial.path}"
        if rule.last_message:
            text += f": {rule.last_message}"
        logger.warning("%s%s", text, f" ({self.note})" if self.note else "")
        if self.webhook:
            body = json.dumps({"text": text, "rule": rule.rule_name, "step": step,
                               "trial": rule.base_trial.path}).encode()
            request = urllib.request.Request(self.webhook, data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
            except Exception as exc:
                logger.error("rule %s: webhook %s failed: %s", rule.rule_name, self.webhook, exc)


def parse_actions(action_str: Any, rule_name: str = "rule") -> list[Action]:
    """Parse smdebug's action string (JSON object or list) into actions; None or "" gives none.

    Raises:
        MltraceValueError: invalid JSON or an unknown action name.
    """
    if action_str is None or (isinstance(action_str, str) and not action_str.strip()):
        return []
    if isinstance(action_str, str):
        try:
            spec = json.loads(action_str)
        except ValueError as exc:
            raise MltraceValueError(
                f"{rule_name}: action_str {action_str!r} is not JSON ({exc}); e.g. "
                '\'{"name": "stoptraining"}\' or \'[{"name": "notify", "webhook": "https://..."}]\''
            ) from None
    else:
        spec = action_str
    items = spec if isinstance(spec, list) else [spec]
    actions: list[Action] = []
    for item in items:
        item = {str(k).lower(): v for k, v in item.items()} if isinstance(item, dict) else item
        if not isinstance(item, dict) or "name" not in item:
            raise MltraceValueError(f"{rule_name}: each action needs a name, got {item!r}")
        name = str(item["name"]).lower()
        if name == "stoptraining":
            actions.append(StopTraining())
        elif name == "dumpflightrecorder":
            actions.append(DumpFlightRecorder())
        elif name == "notify":
            actions.append(Notify(item.get("webhook") or item.get("url")))
        elif name in ("sms", "email"):
            note = f"{name} to {item.get('endpoint')} needs SageMaker's SNS; logged instead"
            actions.append(Notify(note=note))
        else:
            raise MltraceValueError(
                f"{rule_name}: unknown action {name!r}; use stoptraining, dumpflightrecorder "
                "or notify (sms/email are logged)"
            )
    return actions
