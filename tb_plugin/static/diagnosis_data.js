// mltrace tab: the diagnosis view's data logic, with no DOM (tests/tb_plugin/js/ checks it with
// node's test runner). Pure functions of the /diagnosis answer (a report of schema
// mltrace.diagnosis/1, docs/guide/diagnose.md) and of the overview it is drawn on.

import {columnOf, fmt} from "./data.js";

/** A number of a report: its non-finite values come as "inf", "-inf" and "nan". */
export function reportNumber(v) {
  if (v === "inf") return Infinity;
  if (v === "-inf") return -Infinity;
  if (v === "nan") return NaN;
  return typeof v === "number" ? v : NaN;
}

function list(v) {
  return Array.isArray(v) ? v : [];
}

/** The tensor where the trouble began: the origin's first, else the anomaly's own (null). */
export function originTensor(report) {
  const first = list(report && report.origin)[0];
  if (first && typeof first.tensor === "string") return first.tensor;
  const a = report && report.anomaly;
  return a && typeof a.tensor === "string" ? a.tensor : null;
}

/** Where a report goes on an overview whose shown rows are `rows`: the onset step and its
 * column, the anomaly's step and column when it is another step, the origin tensor and its row
 * (-1 when not among the rows, a column -1 when the step is outside the overview's steps). */
export function diagnosisMarks(overview, rows, report) {
  const none = {onset: null, onsetColumn: -1, anomalyStep: null, anomalyColumn: -1, origin: null, originRow: -1};
  if (!report || !report.found) return none;
  const onset = Number.isInteger(report.onset) ? report.onset : null;
  const step = report.anomaly && Number.isInteger(report.anomaly.step) ? report.anomaly.step : null;
  const anomalyStep = step === onset ? null : step;
  const origin = originTensor(report);
  return {
    onset, onsetColumn: onset === null ? -1 : columnOf(overview, onset),
    anomalyStep, anomalyColumn: anomalyStep === null ? -1 : columnOf(overview, anomalyStep),
    origin, originRow: origin === null ? -1 : rows.findIndex((r) => r.tensor === origin),
  };
}

/** The collection to open the overview on to see `tensor`: the smallest of `collections`
 * ({name: [tensors]}, a /run answer's) that holds it, "all" and "default" last; null if none. */
export function collectionOf(collections, tensor) {
  let best = null;
  for (const [name, tensors] of Object.entries(collections || {})) {
    if (!list(tensors).includes(tensor)) continue;
    const rank = [name === "all" || name === "default" ? 1 : 0, tensors.length, name];
    if (best === null || rank[0] < best[0] || (rank[0] === best[0] && (rank[1] < best[1] ||
        (rank[1] === best[1] && rank[2] < best[2])))) best = rank;
  }
  return best === null ? null : best[2];
}

/** The evidence of a report, the named cause's first, each cause's in the report's order:
 * [{cause, named, items: [{supports, text}]}]. */
export function evidenceByCause(report) {
  const cause = (report && report.cause) || {};
  const groups = new Map();
  for (const e of list(cause.evidence)) {
    if (!e || typeof e.text !== "string") continue;
    const name = typeof e.cause === "string" ? e.cause : "?";
    if (!groups.has(name)) groups.set(name, []);
    groups.get(name).push({supports: e.supports === true, text: e.text});
  }
  const named = cause.class;
  return [...groups.entries()]
    .map(([name, items]) => ({cause: name, named: name === named, items}))
    .sort((a, b) => Number(b.named) - Number(a.named));
}

/** How far an origin tensor left its window: "not finite", or "robust z +695.4". */
export function zText(z) {
  const x = reportNumber(z);
  if (Number.isNaN(x)) return "—";
  if (!Number.isFinite(x)) return "not finite";
  return `robust z ${x >= 0 ? "+" : ""}${x.toFixed(1)}`;
}

/** One sample that stands out: "sample 2: loss 14.88 (batch median 4.84e-4), fingerprint …". */
export function sampleText(s) {
  const fp = typeof s.fingerprint === "string" ? `, fingerprint ${s.fingerprint}` : "";
  return `sample ${s.index}: loss ${fmt(reportNumber(s.loss))} (batch median ${fmt(reportNumber(s.batch_median))})${fp}`;
}

/** Where the report comes from, for the section's heading. */
export function sourceText(answer) {
  const d = answer.diagnosis || {};
  const worker = d.worker ? ` (${d.worker})` : "";
  if (answer.source === "stored") {
    const others = list(answer.stored_workers).filter((w) => w !== d.worker);
    return `kept in the trial${worker}` + (others.length ? `; also kept for ${others.join(", ")}` : "");
  }
  return `computed now${worker}, not written into the trial`;
}
