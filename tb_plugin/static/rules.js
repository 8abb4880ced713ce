// mltrace tab: the Rules panel. One row per rule (its newest execution), findings first and the
// rules that found nothing folded away; each row keeps its history of executions with their times.
// Above the rules, the flight recorder (the first non-finite tensor, prominently, and each dump)
// and "Non-finite values": every tensor that held a NaN or an infinity, found with no rule run.
// Every tensor a finding names is a link to its detail view at the step the rule first fired.
// Steps are global steps, with the mode step beside (what the rule's own message counts in).
// An MLflow link only where the rule run recorded its page (or --mltrace_mlflow_uri names a UI).

import {clear, el, getJSON, isAbort, runSections} from "./dom.js";
import {dumpStepsText, firedText, splitRules, stepLabel, timeText} from "./data.js";
import {findingStep, kindText, messageParts, nonfiniteStep, nonfiniteTitle} from "./rules_data.js";

const NONFINITE_POLL_MS = 300;

/** A link that opens `tensor`'s detail view marked at global step `step` (null: no step). */
function tensorLink(ctx, tensor, step, why, cls) {
  const at = Number.isInteger(step) ? ` at global step ${step}` : "";
  return el("button", {class: `mt-linkbutton ${cls}`, "data-tensor": tensor, "data-step": Number.isInteger(step) ? step : null,
    title: `open ${tensor}${at}`, on: {click: () => {
      ctx.state.stepWhy = {tensor, step, text: why};
      ctx.openDetail(tensor, Number.isInteger(step) ? step : null);
    }}}, tensor);
}

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
  return x.mlflow_run_id ? el("code", {class: "mt-mlflow-id", title: "MLflow run id (no MLflow UI address was recorded)"}, x.mlflow_run_id) : "—";
}

/** A rule's executions, folded, in a row of the table's full width under the rule's own. */
function history(rule) {
  const rows = rule.history.map((x) => el("tr", {},
    el("td", {}, timeText(x.started)), el("td", {}, x.ended ? timeText(x.ended) : "running"),
    el("td", {}, el("span", {class: `mt-status mt-status-${x.status}`}, x.status)),
    el("td", {}, String(x.evaluated_steps)), el("td", {}, firedText(x) || "—"), el("td", {}, mlflowCell(x))));
  return el("tr", {class: "mt-history-row", "data-history-of": rule.rule}, el("td", {colspan: 7},
    el("details", {class: "mt-history"}, el("summary", {}, `${rule.rule}: history of ${rule.runs} execution${rule.runs > 1 ? "s" : ""}`),
      el("table", {class: "mt-table"}, el("tr", {}, ["Started", "Ended", "Status", "Steps checked", "Fired at", "MLflow"].map((h) => el("th", {}, h))), rows))));
}

/** A finding's message, each tensor it names a link to its detail at the first fired step. */
function findingText(ctx, rule, x) {
  const step = findingStep(x);
  return el("span", {class: "mt-finding-text"}, messageParts(x.message, x.mentions).map((p) => (p.tensor
    ? tensorLink(ctx, p.tensor, step, `${rule}'s finding`, "mt-finding-link")
    : p.text)));
}

function ruleRow(ctx, rule) {
  const x = rule.history[0];
  const first = x.first ? `first at step ${stepLabel(x.first.step, x.first.mode ? `${x.first.mode} ${x.first.mode_step}` : null)}` : "";
  const thinned = x.fired_thinned ? el("div", {class: "mt-note"}, `${x.fired.length} of the ${x.fired_count} fired steps listed, spread evenly`) : null;
  let what;
  if (x.status === "NothingChecked") what = "no tensor of the trial matched what this rule inspects: nothing was checked";
  else if (x.message) what = findingText(ctx, rule.rule, x);
  else what = x.error || (x.status === "NoIssuesFound" ? `checked ${x.evaluated_steps} steps, found nothing` : "—");
  return [el("tr", {class: "mt-rule-row", "data-rule": rule.rule},
    el("td", {class: "mt-name"}, rule.rule),
    el("td", {}, el("span", {class: `mt-status mt-status-${x.status}`}, x.status)),
    el("td", {}, firedText(x) || "—", first ? el("div", {class: "mt-note"}, first) : null, thinned),
    el("td", {}, what),
    el("td", {}, timeText(x.started)),
    el("td", {class: "mt-pre"}, JSON.stringify(x.parameters, null, 1)),
    el("td", {}, mlflowCell(x))), history(rule)];
}

/** A rules table in a box of the panel's width: cells wrap, and what cannot wrap scrolls inside
 * the box (an expanded history or long parameters never push the table out of its section). */
function table(ctx, rules, cls) {
  return el("div", {class: "mt-rules-box"}, el("table", {class: `mt-table mt-rules ${cls}`},
    el("colgroup", {}, [13, 10, 14, 29, 10, 16, 8].map((w) => el("col", {style: `width:${w}%`}))),
    el("tr", {}, ["Rule", "Status", "Fired at global step (mode step)", "Finding", "Last run", "Parameters", "MLflow"].map((h) => el("th", {}, h))),
    rules.flatMap((r) => ruleRow(ctx, r))));
}

/** The "Non-finite values" section of one run: each tensor that held a NaN or an infinity, its
 * first step a link to its detail there. */
function nonfiniteBlock(ctx, nf) {
  const box = el("div", {class: `mt-nonfinite-values${nf.tensors.length ? " mt-nonfinite-found" : ""}`,
    "data-complete": nf.complete ? "1" : "0", "data-count": nf.tensors.length},
  el("h4", {class: "mt-nonfinite-values-title"}, nonfiniteTitle(nf)));
  if (!nf.tensors.length) return box;
  box.append(el("div", {class: "mt-rules-box"}, el("table", {class: "mt-table mt-nonfinite-table"},
    el("tr", {}, ["Tensor (opens at its first non-finite step)", "First at global step", "Value", "Steps not finite", "Last not finite", "Worker", "Found by"]
      .map((h) => el("th", {}, h))),
    nf.tensors.map((t) => el("tr", {"data-tensor": t.tensor, "data-step": t.step},
      el("td", {}, tensorLink(ctx, t.tensor, t.step, "the non-finite values", "mt-nonfinite-link")),
      el("td", {}, nonfiniteStep(t)), el("td", {}, kindText(t.kind)),
      el("td", {}, String(t.steps)), el("td", {}, String(t.last_step)),
      el("td", {}, t.worker || "(first)"), el("td", {}, t.source === "trial" ? `its ${t.statistic}` : t.source))))));
  return box;
}

/** Asks /rules again while the non-finite scan has not read every tensor, and redraws its block. */
async function followNonfinite(ctx, run, holder, nf) {
  while (!nf.complete && ctx.alive()) {
    await new Promise((done) => setTimeout(done, NONFINITE_POLL_MS));
    try {
      nf = (await getJSON("rules", {run}, ctx.signal)).nonfinite;
    } catch (err) {
      if (!isAbort(err)) holder.append(el("div", {class: "mt-error"}, err.message));
      return;
    }
    if (!ctx.alive()) return;
    clear(holder).append(nonfiniteBlock(ctx, nf));
  }
}

export function rulesPanel(ctx) {
  return runSections(ctx, "rules", (section, answer) => {
    const recorder = flightRecorder(answer.flight_recorder);
    if (recorder) section.appendChild(recorder);
    if (answer.nonfinite) {
      const holder = el("div", {class: "mt-nonfinite-holder"}, nonfiniteBlock(ctx, answer.nonfinite));
      section.appendChild(holder);
      followNonfinite(ctx, answer.run, holder, answer.nonfinite);
    }
    if (!answer.rules.length) {
      section.appendChild(el("div", {class: "mt-note"}, "No rule has run on this trial yet (python -m mltrace.rules.rule_invoker --trial-dir ... --rule-name ...)."));
      return;
    }
    const {loud, quiet} = splitRules(answer.rules);
    if (loud.length) section.appendChild(table(ctx, loud, "mt-rules-loud"));
    else section.appendChild(el("div", {class: "mt-note mt-clean"}, "No rule found an issue."));
    if (quiet.length) {
      section.appendChild(el("details", {class: "mt-quiet"},
        el("summary", {}, `${quiet.length} rule${quiet.length > 1 ? "s" : ""} without findings`), table(ctx, quiet, "mt-rules-quiet")));
    }
    if (answer.mlflow && answer.mlflow.command) {
      section.appendChild(el("div", {class: "mt-note mt-mlflow-hint"}, "This trial's MLflow runs are in a database tracking store; to look at them, serve it with ",
        el("code", {}, answer.mlflow.command), " (no link is made: nothing records where a UI serves it)."));
    }
  });
}
