// mltrace tab: the Rules panel's data logic, with no DOM (tests/tb_plugin/js/rules_data.test.mjs):
// a finding's message cut into text and the tensors it names, and the words of the "Non-finite
// values" section.

import {stepLabel} from "./data.js";

/** A rule's message as parts [{text}] and [{text, tensor}] from the backend's mentions
 * ([start, end, tensor], in code points, sorted, none overlapping): each named tensor becomes a
 * part of its own, so that the panel makes it a link. Mentions that do not fit the text are left
 * out (the message stays whole). */
export function messageParts(message, mentions) {
  const chars = Array.from(message || "");
  const parts = [];
  let at = 0;
  for (const [start, end, tensor] of mentions || []) {
    if (!(Number.isInteger(start) && Number.isInteger(end)) || start < at || end > chars.length || end <= start) continue;
    const text = chars.slice(start, end).join("");
    if (text !== tensor) continue;
    if (start > at) parts.push({text: chars.slice(at, start).join("")});
    parts.push({text, tensor});
    at = end;
  }
  if (at < chars.length) parts.push({text: chars.slice(at).join("")});
  return parts;
}

/** The step a finding's links open its tensors at: the first step the rule fired (the one its
 * message is about), else null. */
export function findingStep(execution) {
  return execution && execution.first && Number.isInteger(execution.first.step) ? execution.first.step : null;
}

/** "NaN", "+inf", "-inf" or "non-finite" (the flight recorder names no kind). */
export function kindText(kind) {
  if (kind === "inf") return "+inf";
  return kind || "non-finite";
}

/** "12 (TRAIN 12)" for a non-finite entry's first step. */
export function nonfiniteStep(entry) {
  return stepLabel(entry.step, entry.mode ? `${entry.mode} ${entry.mode_step}` : null);
}

/** The heading of the "Non-finite values" section. */
export function nonfiniteTitle(nf) {
  const n = nf.tensors.length;
  const tensors = `${n} tensor${n === 1 ? "" : "s"}`;
  const looked = nf.complete ? "" : ` (looked at ${nf.checked} of ${nf.total} tensors so far…)`;
  if (!n) return nf.complete ? `No NaN or infinity in the ${nf.total} tensors saved` : `Looking for NaN and infinities${looked}`;
  return `Non-finite values: ${tensors} held a NaN or an infinity${looked}`;
}
