// mltrace tab: the diagnosis view, shown with the overview. Why the run broke (the report of
// `mltrace diagnose`, docs/guide/diagnose.md): the one-line message, the cause and its summary,
// where the trouble began (the origin, each tensor a link to its detail at the step it left its
// window), the evidence for (+) and against (−) each cause, what people usually do, the samples
// that stand out and what was not recorded. The overview marks the onset and the origin
// (markHeatmap). The backend answers the trial's stored report, else one computed on request.

import {clear, el, getJSON, isAbort} from "./dom.js";
import {fmt} from "./data.js";
import {collectionOf, evidenceByCause, originTensor, reportNumber, sampleText, sourceText, zText} from "./diagnosis_data.js";

const ONSET = "#e65100";

/** Asks /diagnosis for `run` and draws it into `box`; resolves to the answer (null when it
 * failed: the error is shown in the box; an AbortError goes to the caller). */
export async function loadDiagnosis(ctx, run, worker, box, options) {
  clear(box).append(el("section", {class: "mt-diagnosis", id: "mt-diagnosis"},
    el("h3", {}, "Diagnosis"), el("div", {class: "mt-note"}, "Diagnosing (the first look reads the whole trial)…")));
  let answer;
  try {
    answer = await getJSON("diagnosis", {run, worker}, ctx.signal);
  } catch (err) {
    if (isAbort(err)) throw err;
    clear(box).append(el("section", {class: "mt-diagnosis", id: "mt-diagnosis"}, el("h3", {}, "Diagnosis"),
      el("div", {class: "mt-error"}, err.message)));
    return null;
  }
  if (!ctx.alive()) return null;
  clear(box).append(diagnosisSection(ctx, answer, options));
  return answer;
}

/** The section of one /diagnosis answer. options.shown(tensor): whether the overview has the
 * tensor's row; options.showCollection(name): open the overview on that collection. */
export function diagnosisSection(ctx, answer, options = {}) {
  const d = answer.diagnosis;
  const head = el("h3", {}, "Diagnosis ", el("span", {class: "mt-note mt-diag-source"}, sourceText(answer)));
  if (!d) {
    return el("section", {class: "mt-diagnosis", id: "mt-diagnosis"}, head,
      el("div", {class: "mt-error"}, answer.error || "no diagnosis"));
  }
  const cause = d.cause || null;
  const section = el("section", {class: `mt-diagnosis ${d.found ? "mt-diag-found" : "mt-diag-clean"}`, id: "mt-diagnosis",
    "data-source": answer.source, "data-found": d.found ? "1" : "0", "data-cause": cause ? cause.class : ""},
  head, el("div", {class: "mt-diag-message", id: "mt-diag-message"}, String(d.message || "")));
  if (!d.found) return section;
  if (cause) {
    section.append(el("div", {class: "mt-diag-cause"},
      el("span", {class: `mt-cause mt-cause-${cause.class}`, id: "mt-diag-cause"}, String(cause.class)), " ",
      el("span", {id: "mt-diag-summary"}, String(cause.summary || ""))));
  }
  if (d.anomaly) {
    section.append(el("div", {class: "mt-note"}, `Anomaly at global step ${d.anomaly.step} (${d.anomaly.kind}): ${d.anomaly.detail || ""}`));
  }
  section.append(el("div", {class: "mt-diag-cols"},
    el("div", {class: "mt-diag-col"}, originBlock(ctx, d, options)),
    el("div", {class: "mt-diag-col"}, evidenceBlock(d), adviceBlock(cause), samplesBlock(d), recordNextBlock(d))));
  return section;
}

function originBlock(ctx, d, options) {
  const origin = Array.isArray(d.origin) ? d.origin : [];
  const first = originTensor(d);
  const out = [el("h4", {}, `Where it began: global step ${d.onset}${d.origin_layer ? `, layer ${d.origin_layer}` : ""}`)];
  if (!origin.length) {
    out.push(el("div", {class: "mt-note"}, "No tensor left its window before the anomaly."));
    return out;
  }
  const rows = origin.map((o, i) => el("tr", {class: i === 0 ? "mt-diag-first" : ""},
    el("td", {}, el("button", {class: "mt-linkbutton mt-diag-origin", "data-tensor": o.tensor, "data-step": o.step,
      title: `open ${o.tensor} at global step ${o.step}`, on: {click: () => ctx.openDetail(o.tensor, o.step)}}, o.tensor)),
    el("td", {}, String(o.step)), el("td", {}, String(o.phase)), el("td", {}, zText(o.z)),
    el("td", {}, `${fmt(reportNumber(o.value))} (median ${fmt(reportNumber(o.window_median))})`)));
  out.push(el("table", {class: "mt-table mt-diag-origins"},
    el("tr", {}, ["Tensor (first out of its window first)", "Step", "Phase", "How far", "Value"].map((h) => el("th", {}, h))), rows));
  if (first && options.shown && !options.shown(first)) {
    const coll = collectionOf(options.collections, first);
    out.push(el("div", {class: "mt-note", id: "mt-diag-not-shown"}, `${first} is not among the overview's rows. `,
      coll && options.showCollection ? el("button", {class: "mt-linkbutton", id: "mt-diag-show-origin", "data-collection": coll,
        on: {click: () => options.showCollection(coll)}}, `Show the collection ${coll}`) : null));
  }
  return out;
}

function evidenceBlock(d) {
  const groups = evidenceByCause(d);
  if (!groups.length) return null;
  return el("div", {class: "mt-diag-evidence"}, el("h4", {}, "Evidence"),
    el("ul", {class: "mt-evidence"}, groups.flatMap((g) => g.items.map((e) => el("li", {
      class: `${e.supports ? "mt-ev-for" : "mt-ev-against"}${g.named ? " mt-ev-named" : ""}`, "data-cause": g.cause},
    el("b", {class: "mt-ev-sign"}, e.supports ? "+" : "−"), ` ${g.cause}: ${e.text}`)))));
}

function adviceBlock(cause) {
  const advice = cause && Array.isArray(cause.advice) ? cause.advice : [];
  if (!advice.length) return null;
  return el("div", {}, el("h4", {}, "What people usually do"),
    el("ul", {class: "mt-advice"}, advice.map((a) => el("li", {}, String(a)))));
}

function samplesBlock(d) {
  const samples = Array.isArray(d.samples) ? d.samples : [];
  if (!samples.length) return null;
  const more = d.left_out && d.left_out.samples ? ` (${d.left_out.samples} more left out)` : "";
  return el("div", {}, el("h4", {}, `Samples that stand out${more}`),
    el("ul", {class: "mt-samples"}, samples.map((s) => el("li", {"data-index": s.index}, sampleText(s)))),
    el("div", {class: "mt-note"}, "Find the batch in the pipeline by its fingerprints: mltrace.pytorch.fingerprint(batch)."));
}

function recordNextBlock(d) {
  const names = Array.isArray(d.record_next) ? d.record_next : [];
  if (!names.length) return null;
  return el("div", {class: "mt-note", id: "mt-diag-record-next"}, `Not recorded (would tell more): ${names.join(", ")}`);
}

/** The words of the diagnosis' marks; the difference view gives its own (the same shapes). */
const DIAGNOSIS_WORDS = {
  line: (step) => `onset ${step}`,
  origin: (tensor) => `${tensor}: the origin of the diagnosis (it left its window first)`,
};

/** Marks a report on a drawn overview: a line at the onset's column over the rows (and a fainter
 * one at the anomaly's step when it is later), the origin tensor's label and row outlined.
 * marks: diagnosisMarks(...); geometry: {grid, canvas, labels, labelW, stripH, rowH, cellW, height,
 * open(tensor): opens a tensor's detail}; words: {line(step), origin(tensor)}, the marks' titles. */
export function markHeatmap(marks, geometry, words = DIAGNOSIS_WORDS) {
  const {grid, canvas, labels, labelW, stripH, rowH, cellW, height} = geometry;
  canvas.dataset.onsetColumn = String(marks.onsetColumn);
  canvas.dataset.originRow = String(marks.originRow);
  if (marks.originRow >= 0) {
    const g = canvas.getContext("2d");
    g.strokeStyle = ONSET;
    g.lineWidth = 2;
    g.strokeRect(1, stripH + marks.originRow * rowH + 1, canvas.width - 2, rowH - 2);
    g.lineWidth = 1;
    const title = words.origin(marks.origin);
    const named = labels.querySelectorAll(".mt-ov-label");
    for (const label of named) {
      if (label.getAttribute("data-tensor") === marks.origin) {
        label.classList.add("mt-origin");
        label.setAttribute("title", title);
      }
    }
    if (!named.length) {  // rows too thin for names: the origin's name still stands beside its row
      grid.append(el("div", {class: "mt-ov-label mt-origin mt-origin-tag", "data-tensor": marks.origin, title,
        style: `top:${stripH + marks.originRow * rowH + rowH / 2 - 7}px;width:${labelW}px`,
        on: {click: () => geometry.open(marks.origin)}}, marks.origin));
    }
  }
  const line = (column, step, cls, text) => el("div", {class: `mt-diag-line ${cls}`, "data-step": step, "data-column": column,
    title: text, style: `left:${labelW + (column + 0.5) * cellW}px;height:${height}px`}, el("span", {class: "mt-diag-line-label"}, text));
  if (marks.onsetColumn >= 0) grid.append(line(marks.onsetColumn, marks.onset, "mt-onset", words.line(marks.onset)));
  if (marks.anomalyColumn >= 0 && marks.anomalyColumn !== marks.onsetColumn) {
    grid.append(line(marks.anomalyColumn, marks.anomalyStep, "mt-anomaly-line", `anomaly ${marks.anomalyStep}`));
  }
}
