// mltrace tab: the difference view's data logic, with no DOM (tests/tb_plugin/js/ checks it with
// node's test runner). Pure functions of a /difference answer: the overview of one run whose
// cells are its statistic over the first run's at the same step, with `against` (the first run)
// and `parting` (where the two runs part ways, or null).

import {columnOf, fmt} from "./data.js";
import {reportNumber} from "./diagnosis_data.js";

/** The name a run's column goes by: "b ÷ a" for a difference, else the run's name. */
export function runLabel(answer) {
  return answer.against ? `${answer.run} ÷ ${answer.against}` : answer.run;
}

/** Where the parting goes on the grid whose shown lines are `rows` ({tensor} each), in the
 * shape of diagnosisMarks: its step and column, its tensor and row (-1 where not shown). */
export function partingMarks(answer, rows) {
  const none = {onset: null, onsetColumn: -1, anomalyStep: null, anomalyColumn: -1, origin: null, originRow: -1};
  const p = answer && answer.parting;
  if (!p || !Number.isInteger(p.step)) return none;
  return {...none, onset: p.step, onsetColumn: columnOf(answer, p.step), origin: p.tensor,
    originRow: rows.findIndex((r) => r.tensor === p.tensor)};
}

/** One line on where two runs part ways (or that they do not, or that reading goes on). */
export function partingText(answer) {
  if (!answer.complete) return `${runLabel(answer)}: reading both runs…`;
  const p = answer.parting;
  if (!p) return `${answer.run} and ${answer.against} agree at every step both saved (within 0.1%)`;
  const others = Array.isArray(p.others) && p.others.length ? `; ${p.others.length} more tensors differ at that step` : "";
  return `${answer.run} parts ways with ${answer.against} at global step ${p.step} in ${p.tensor}: ` +
    `${fmt(reportNumber(p.reference_value))} → ${fmt(reportNumber(p.value))} (×${fmt(reportNumber(p.ratio))})${others}`;
}
