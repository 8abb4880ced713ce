// mltrace tab: the Rules panel. One row per rule (its newest execution), findings first and the
// rules that found nothing folded away; each row keeps its history of executions with their times.
// Above the rules, the flight recorder: the first non-finite tensor, prominently, and each dump.
// Steps are global steps, with the mode step beside (what the rule's own message counts in).

import {el, runSections} from "./dom.js";
import {dumpStepsText, firedText, splitRules, stepLabel, timeText} from "./data.js";

function firstNonFinite(x) {
  const others = x.nonfinite_tensors.filter((t) => t !== x.tensor);
  return el("div", {class: "mt-nonfinite", "data-tensor": x.tensor},
    el("div", {class: "mt-nonfinite-title"}, "First non-finite tensor: ", el("code", {class: "mt-nonfinite-name"}, x.tensor)),
    el("div", {}, `at global step ${stepLabel(x.step, `${x.mode} ${x.mode_step}`)}, worker ${x.worker}, ${x.phase} pass` +
      ` (tensor ${x.position + 1} of the step in execution order)`),
    others.length ? el("div", {class: "mt-note"}, `also non-finite at that step: ${others.join(", ")}`) : null);
}

function dumpsTable(dumps) {
  return el("table", {class: "mt-table mt-dumps"},
    el("tr", {}, ["Dumped at global step", "Trigger", "Reason", "Worker", "Steps written before", "Steps after", "Time"].map((h) => el("th", {}, h))),
    dumps.map((x) => el("tr", {"data-trigger": x.trigger},
      el("td", {}, stepLabel(x.step, `${x.mode} ${x.mode_step}`)),
      el("td", {}, el("span", {class: `mt-trigger mt-trigger-${x.trigger}`}, x.trigger)),
      el("td", {}, x.reason || "—"), el("td", {}, x.worker),
      el("td", {}, dumpStepsText(x.before)), el("td", {}, dumpStepsText(x.after)),
      el("td", {}, timeText(x.time)))));
}

/** The flight recorder's block of a run, or null when it has nothing to show. */
function flightRecorder(fr) {
  if (!fr || (!fr.first_nonfinite && !fr.dumps.length)) return null;
  return el("div", {class: "mt-flight"},
    fr.first_nonfinite ? firstNonFinite(fr.first_nonfinite) : null,
    fr.dumps.length ? el("h4", {}, `Flight recorder: ${fr.dumps.length} dump${fr.dumps.length > 1 ? "s" : ""}`) : null,
    fr.dumps.length ? dumpsTable(fr.dumps) : null);
}

function mlflowCell(x) {
  if (x.mlflow_url) return el("a", {href: x.mlflow_url, target: "_blank", rel: "noopener noreferrer", class: "mt-mlflow"}, "MLflow run");
  return x.mlflow_run_id ? el("code", {}, x.mlflow_run_id) : "—";
}

function history(rule) {
  const rows = rule.history.map((x) => el("tr", {},
    el("td", {}, timeText(x.started)), el("td", {}, x.ended ? timeText(x.ended) : "running"),
    el("td", {}, el("span", {class: `mt-status mt-status-${x.status}`}, x.status)),
    el("td", {}, String(x.evaluated_steps)), el("td", {}, firedText(x) || "—"), el("td", {}, mlflowCell(x))));
  return el("details", {class: "mt-history"}, el("summary", {}, `history: ${rule.runs} execution${rule.runs > 1 ? "s" : ""}`),
    el("table", {class: "mt-table"}, el("tr", {}, ["Started", "Ended", "Status", "Steps checked", "Fired at", "MLflow"].map((h) => el("th", {}, h))), rows));
}

function ruleRow(rule) {
  const x = rule.history[0];
  const first = x.first ? `first at step ${stepLabel(x.first.step, x.first.mode ? `${x.first.mode} ${x.first.mode_step}` : null)}` : "";
  const what = x.status === "NothingChecked"
    ? "no tensor of the trial matched what this rule inspects: nothing was checked"
    : (x.message || x.error || (x.status === "NoIssuesFound" ? `checked ${x.evaluated_steps} steps, found nothing` : "—"));
  return el("tr", {"data-rule": rule.rule},
    el("td", {class: "mt-name"}, rule.rule),
    el("td", {}, el("span", {class: `mt-status mt-status-${x.status}`}, x.status)),
    el("td", {}, firedText(x) || "—", first ? el("div", {class: "mt-note"}, first) : null),
    el("td", {}, what),
    el("td", {}, timeText(x.started), history(rule)),
    el("td", {class: "mt-pre"}, JSON.stringify(x.parameters, null, 1)),
    el("td", {}, mlflowCell(x)));
}

function table(rules, cls) {
  return el("table", {class: `mt-table mt-rules ${cls}`},
    el("tr", {}, ["Rule", "Status", "Fired at global step (mode step)", "Finding", "Last run", "Parameters", "MLflow"].map((h) => el("th", {}, h))),
    rules.map(ruleRow));
}

export function rulesPanel(ctx) {
  return runSections(ctx, "rules", (section, answer) => {
    const recorder = flightRecorder(answer.flight_recorder);
    if (recorder) section.appendChild(recorder);
    if (!answer.rules.length) {
      section.appendChild(el("div", {class: "mt-note"}, "No rule has run on this trial yet (python -m mltrace.rules.rule_invoker --trial-dir ... --rule-name ...)."));
      return;
    }
    const {loud, quiet} = splitRules(answer.rules);
    if (loud.length) section.appendChild(table(loud, "mt-rules-loud"));
    else section.appendChild(el("div", {class: "mt-note mt-clean"}, "No rule found an issue."));
    if (quiet.length) {
      section.appendChild(el("details", {class: "mt-quiet"},
        el("summary", {}, `${quiet.length} rule${quiet.length > 1 ? "s" : ""} without findings`), table(quiet, "mt-rules-quiet")));
    }
    if (answer.mlflow && answer.mlflow.command) {
      section.appendChild(el("div", {class: "mt-note"}, "MLflow links open the MLflow UI of this trial's tracking store; start it with ",
        el("code", {}, answer.mlflow.command)));
    }
  });
}
