// mltrace tab: the overview's grid. One column of labels (sticky at the left) and one canvas per
// run side by side, in a box that scrolls: rows keep a readable height at any count, labels
// stay beside their rows, the runs' names and steps stay on top. The readout of the cell under
// the pointer follows the pointer (kept inside the window). Lines come from overview_rows.js,
// colours from overview_scale.js; the diagnosis (diagnosis.js) marks the first run's canvas.

import {el} from "./dom.js";
import {COLORS, columnLabel, findingMarks, fmt, nonfiniteByColumn} from "./data.js";
import {markHeatmap} from "./diagnosis.js";
import {diagnosisMarks, originTensor} from "./diagnosis_data.js";
import {partingMarks, runLabel} from "./difference_data.js";
import {groupRow} from "./overview_rows.js";
import {RATIOS, cellPaint, cellValue} from "./overview_scale.js";

export const LABEL_W = 300;
export const STRIP_H = 12;
export const HEAD_H = 30;
export const RUN_GAP = 8;
const ROW_H = 14;
const MAX_CANVAS_H = 30000;  // browsers draw nothing on taller canvases

/** The height of a line: 14 px, less only where a canvas that tall could not be drawn. */
export function rowHeight(lineCount) {
  if (STRIP_H + ROW_H * lineCount <= MAX_CANVAS_H) return ROW_H;
  return Math.max(2, Math.floor((MAX_CANVAS_H - STRIP_H) / lineCount));
}

/**
 * The grid of `view`: {runs: [answers, first run first], lines, sections, scales (Map kind ->
 * scale), normalize, report (the first run's diagnosis or null), plotW, toggle(key), filter}.
 * Returns the scrolling box; the readout element goes to `tipHost`.
 */
export function drawGrid(ctx, view, tipHost) {
  const rowH = rowHeight(view.lines.length);
  const n = view.runs.length;
  const width = Math.max(120, Math.floor((view.plotW - RUN_GAP * (n - 1)) / n));
  const tip = el("div", {class: "mt-tip mt-ov-tip", id: "mt-ov-tip", role: "status"});
  tipHost.append(tip);
  const labels = labelColumn(ctx, view, rowH);
  const grid = el("div", {class: "mt-ov-grid"}, labels);
  view.runs.forEach((answer, k) => grid.append(runColumn(ctx, view, answer, k === 0,
    {rowH, width, tip, labels})));
  return el("div", {class: "mt-ov-scroll", id: "mt-ov-scroll"}, grid);
}

function labelColumn(ctx, view, rowH) {
  const col = el("div", {class: "mt-ov-labels", style: `width:${LABEL_W}px`});
  const prefixes = view.sections.filter((s) => s.prefix);
  const text = prefixes.length ? prefixes.map((s) => (view.sections.length > 1 ? `${s.kind}: ${s.prefix}…` : `${s.prefix}…`)).join("  ") : "";
  col.append(el("div", {class: "mt-ov-head mt-ov-prefix", id: "mt-ov-prefix", title: text ? `every name below starts with ${text}` : "",
    style: `height:${HEAD_H}px`}, text), el("div", {style: `height:${STRIP_H}px`}));
  if (rowH < 10) {
    col.append(el("div", {class: "mt-note"}, `${view.lines.length} lines: collapse groups or filter to name them`));
    return col;
  }
  const marks = new Set();
  for (const a of view.runs) for (const t of findingMarks(a).rows) marks.add(t);
  let band = 0;
  for (const line of view.lines) {
    if (line.groupStart || line.type !== "row") band++;
    col.append(lineLabel(ctx, view, line, rowH, marks, band % 2));
  }
  return col;
}

function toggle(view, line, open) {
  return el("button", {class: "mt-ov-toggle", type: "button", "data-group": line.key,
    title: `${open ? "collapse" : "expand"} ${line.label !== undefined && line.type === "group" ? line.label : line.toggle}`,
    on: {click: (e) => { e.stopPropagation(); view.toggle(line.key); }}}, open ? "▾" : "▸");
}

function lineLabel(ctx, view, line, rowH, marks, band) {
  const style = `height:${rowH}px;line-height:${rowH}px`;
  if (line.type === "section") {
    return el("div", {class: "mt-ov-section", "data-kind": line.kind, style},
      `${line.kind} · ${line.count} tensors · own colour scale`);
  }
  if (line.type === "group") {
    return el("div", {class: "mt-ov-group", "data-group": line.key, title: line.tensors.join("\n"), style,
      on: {click: () => view.toggle(line.key)}}, toggle(view, line, false),
    el("span", {class: "mt-ov-name"}, `${line.label} (${line.tensors.length} tensors)`));
  }
  const marked = marks.has(line.tensor);
  const cls = ["mt-ov-label", line.inGroup ? `mt-ov-in-group mt-ov-band${band}` : "", marked ? "mt-marked" : ""];
  return el("div", {class: cls.filter(Boolean).join(" "), title: line.tensor, "data-tensor": line.tensor, "data-group": line.key,
    style, on: {click: () => ctx.openDetail(line.tensor)}},
  line.toggle !== null ? toggle(view, line, true) : el("span", {class: "mt-ov-indent"}),
  el("span", {class: "mt-ov-name"}, `${marked ? "! " : ""}${line.label}`));
}

/** Each line's row of one run: its own, a collapsed group's combined one, or null. */
function lineRows(view, answer) {
  const byTensor = new Map(answer.rows.map((r) => [r.tensor, r]));
  const cols = answer.starts.length;
  return view.lines.map((line) => {
    if (line.type === "row") return byTensor.get(line.tensor) || null;
    return line.type === "group" ? groupRow(byTensor, line.tensors, cols) : null;
  });
}

function paintCanvas(canvas, view, answer, rows, geo) {
  const g = canvas.getContext("2d");
  const cols = answer.starts.length, cellW = geo.width / cols, rowH = geo.rowH;
  const kinds = {value: 0, zero: 0, nan: 0, inf: 0, empty: 0};
  const bigger = [];
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  view.lines.forEach((line, i) => {
    const y = STRIP_H + i * rowH, r = rows[i];
    if (line.type === "section") {
      g.fillStyle = "#e0e0e0";
      g.fillRect(0, y + rowH - 2, geo.width, 1);
      return;
    }
    if (!r) {  // a tensor this run does not have
      g.fillStyle = "#fafafa";
      g.fillRect(0, y, geo.width, rowH - 1);
      return;
    }
    const bad = nonfiniteByColumn(r), scale = view.scales.get(line.kind) || null;
    for (let c = 0; c < cols; c++) {
      const {kind, color} = cellPaint(r, c, scale, bad);
      if (line.type === "row") kinds[kind]++;
      g.fillStyle = color;
      g.fillRect(Math.floor(c * cellW), y, Math.max(1, Math.ceil(cellW)), rowH - (rowH > 6 ? 1 : 0));
      if (kind === "nan" || kind === "inf") bigger.push([c, i, color]);
    }
  });
  // a NaN or an infinity in one bucket must still catch the eye: drawn last, 4 px at least
  for (const [c, i, color] of bigger) {
    g.fillStyle = color;
    const w = Math.max(4, Math.ceil(cellW)), h = Math.max(4, rowH);
    g.fillRect(Math.floor(c * cellW + cellW / 2 - w / 2), STRIP_H + i * rowH + rowH / 2 - h / 2, w, h);
  }
  const marks = findingMarks(answer);
  g.strokeStyle = COLORS.inf;
  view.lines.forEach((line, i) => {
    if (line.type === "row" && marks.rows.has(line.tensor)) g.strokeRect(0.5, STRIP_H + i * rowH + 0.5, geo.width - 1, rowH - 1);
  });
  g.fillStyle = COLORS.inf;
  for (const c of marks.cols.keys()) {
    const x = (c + 0.5) * cellW;
    g.beginPath(); g.moveTo(x - 5, 1); g.lineTo(x + 5, 1); g.lineTo(x, STRIP_H - 1); g.fill();
  }
  canvas.dataset.kinds = JSON.stringify(kinds);
  return marks;
}

function runHead(answer, width) {
  const cols = answer.starts.length;
  const ticks = el("div", {class: "mt-ov-axis"});
  const n = Math.min(6, cols);
  for (let k = 0; k < n; k++) {
    const c = Math.round((k * (cols - 1)) / Math.max(1, n - 1));
    ticks.append(el("span", {class: "mt-ov-tick", style: `left:${((c + 0.5) / cols) * 100}%`}, String(answer.starts[c])));
  }
  return el("div", {class: "mt-ov-head mt-ov-runhead", style: `height:${HEAD_H}px;width:${width}px`, title: "global steps"},
    el("div", {class: "mt-ov-runname"}, runLabel(answer)), ticks);
}

function runColumn(ctx, view, answer, first, geo) {
  const H = STRIP_H + geo.rowH * view.lines.length;
  const rowsShown = view.lines.filter((l) => l.type === "row").length;
  const canvas = el("canvas", {class: "mt-ov-canvas", width: geo.width, height: H, "data-run": answer.run,
    "data-against": answer.against || null,
    "data-rows": rowsShown, "data-lines": view.lines.length, "data-columns": answer.starts.length,
    "data-scales": JSON.stringify(Object.fromEntries(view.scales))});
  const plot = el("div", {class: "mt-ov-plot", style: `width:${geo.width}px;height:${H}px`}, canvas);
  const rows = lineRows(view, answer);
  const marks = paintCanvas(canvas, view, answer, rows, geo);
  const cellW = geo.width / answer.starts.length;
  let diag = {onsetColumn: -1, onset: null};
  const named = (tensor) => view.lines.map((l) => ({tensor: l.type === "row" ? l.tensor : (l.type === "group" && l.tensors.includes(tensor) ? tensor : null)}));
  const geometry = {grid: plot, canvas, labels: geo.labels, labelW: 0, stripH: STRIP_H, rowH: geo.rowH, cellW, height: H,
    open: (tensor) => ctx.openDetail(tensor, diag.onset)};
  if (answer.against) {  // a difference: where it parts ways with the first run
    diag = partingMarks(answer, named(answer.parting ? answer.parting.tensor : null));
    markHeatmap(diag, geometry, {line: (step) => `parts ways ${step}`,
      origin: (tensor) => `${tensor}: the first tensor where ${runLabel(answer)} leaves ×1`});
  } else if (first) {
    const origin = view.report && view.report.found ? originTensor(view.report) : null;
    diag = diagnosisMarks(answer, named(origin), view.report);
    markHeatmap(diag, geometry);
  }
  follow(ctx, view, {canvas, answer, rows, marks, diag, cellW, rowH: geo.rowH, tip: geo.tip});
  return el("div", {class: "mt-ov-run", "data-run": answer.run}, runHead(answer, geo.width), plot);
}

/** The readout's text for line i, column c of one run. */
function readout(view, hit, i, c) {
  const {answer, rows} = hit;
  const line = view.lines[i], r = rows[i];
  const where = `${runLabel(answer)} · ${columnLabel(answer, c)}`;
  if (line.type === "section") return `${line.kind}: ${line.count} tensors on a colour scale of their own`;
  const name = line.type === "group" ? `${line.label} (${line.tensors.length} tensors)` : line.tensor;
  if (!r) return `${name} · ${runLabel(answer)}: ${answer.against ? "not in both runs" : "not in this run"}`;
  const bad = nonfiniteByColumn(r).get(c);
  const ratio = RATIOS.has(view.normalize);
  let vals = "not saved";
  if (r.count[c]) vals = r.low[c] === r.high[c] || r.low[c] === null ? fmt(r.high[c]) : `${fmt(r.low[c])} … ${fmt(r.high[c])}`;
  const shown = ratio && r.count[c] ? ` (×${fmt(cellValue(r, c, true))})` : "";
  const held = line.type === "group" && r.worst[c] ? ` — largest in ${r.worst[c]}` : "";
  const extra = bad ? ` — ${bad[1]} NaN, ${bad[2]} +inf, ${bad[3]} -inf` : "";
  return `${name} · ${where} · ${answer.statistic}${view.normalize !== "none" ? ` (${view.normalize})` : ""} ${vals}${shown}${held}${extra}`;
}

/** Puts the readout beside the pointer, on the side where it fits in the window. */
export function placeTip(tip, x, y) {
  tip.style.display = "block";
  const w = tip.offsetWidth, h = tip.offsetHeight;
  const vw = window.innerWidth, vh = window.innerHeight;
  let left = x + 14, top = y + 16;
  if (left + w > vw - 4) left = x - 14 - w;
  if (top + h > vh - 4) top = y - 12 - h;
  tip.style.left = `${Math.max(4, Math.min(left, vw - w - 4))}px`;
  tip.style.top = `${Math.max(4, Math.min(top, vh - h - 4))}px`;
}

function follow(ctx, view, hit) {
  const {canvas, answer, marks, diag, cellW, rowH, tip} = hit;
  const cols = answer.starts.length;
  const cellAt = (ev) => {
    const rect = canvas.getBoundingClientRect();
    const x = (ev.clientX - rect.left) * (canvas.width / rect.width);
    const y = (ev.clientY - rect.top) * (canvas.height / rect.height);
    return {c: Math.min(cols - 1, Math.max(0, Math.floor(x / cellW))), i: Math.floor((y - STRIP_H) / rowH), strip: y < STRIP_H};
  };
  canvas.addEventListener("mousemove", (ev) => {
    const {c, i, strip} = cellAt(ev);
    if (strip) {
      const fired = marks.cols.get(c);
      const what = answer.against ? "the runs part ways" : "the diagnosis' onset";
      const onset = c === diag.onsetColumn ? ` — ${what} (step ${diag.onset})` : "";
      tip.textContent = `${runLabel(answer)} · ${columnLabel(answer, c)}${fired ? `: ${fired.join(", ")} fired` : ""}${onset}`;
    } else if (view.lines[i]) {
      tip.textContent = readout(view, hit, i, c);
    } else {
      return;
    }
    placeTip(tip, ev.clientX, ev.clientY);
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  canvas.addEventListener("click", (ev) => {
    const line = view.lines[cellAt(ev).i];
    if (line && line.type === "row") ctx.openDetail(line.tensor);
    else if (line && line.type === "group") view.toggle(line.key);
  });
}
