// mltrace tab: the model overview. Every tensor of a collection is a row, buckets of global steps
// are columns, one statistic is the colour (log scale; zero, NaN and infinities have colours of
// their own). Rule findings are marked; a click on a row opens the tensor's detail view. The
// diagnosis (diagnosis.js) is shown above it, its onset step and origin tensor marked on it.

import {clear, el, getJSON, isAbort, note} from "./dom.js";
import {loadDiagnosis, markHeatmap} from "./diagnosis.js";
import {diagnosisMarks} from "./diagnosis_data.js";
import {
  COLORS, cellColor, columnLabel, filterNames, findingMarks, fmt, logDomain, nonfiniteByColumn, viridis,
} from "./data.js";

const LABEL_W = 300;
const STRIP_H = 12;

function controls(ctx, answer, redraw) {
  const s = ctx.state;
  const runs = [...s.selected];
  const runSel = el("select", {id: "mt-ov-run", on: {change: (e) => { s.overviewRun = e.target.value; ctx.reload(); }}},
    runs.map((r) => el("option", {value: r, selected: r === answer.run}, r)));
  const collSel = el("select", {id: "mt-ov-collection", on: {change: (e) => { s.collection = e.target.value; ctx.reload(); }}},
    el("option", {value: "", selected: answer.collection === ""}, "(all tensors)"),
    answer.collections.map((c) => el("option", {value: c, selected: c === answer.collection}, c)));
  const statSel = el("select", {id: "mt-ov-statistic", on: {change: (e) => { s.statistic = e.target.value; ctx.reload(); }}},
    answer.statistics.map((c) => el("option", {value: c, selected: c === answer.statistic}, c)));
  const modes = Object.keys((ctx.info.get(answer.run) || {modes: {}}).modes);
  const modeSel = el("select", {id: "mt-ov-mode", on: {change: (e) => { s.overviewMode = e.target.value; ctx.reload(); }}},
    el("option", {value: ""}, "(all modes)"), modes.map((m) => el("option", {value: m, selected: m === s.overviewMode}, m)));
  const workerSel = el("select", {id: "mt-ov-worker", on: {change: (e) => { s.overviewWorker = e.target.value; ctx.reload(); }}},
    el("option", {value: ""}, "(first worker)"), answer.workers.map((w) => el("option", {value: w, selected: w === answer.worker}, w)));
  const filter = el("input", {type: "search", id: "mt-ov-filter", class: "mt-filter", placeholder: "filter tensors (regex or text)",
    value: s.filter, on: {input: (e) => { s.filter = e.target.value; redraw(); }}});
  return el("section", {class: "mt-controls"},
    runs.length > 1 ? el("label", {}, "Run ", runSel) : null,
    el("label", {}, "Collection ", collSel), el("label", {}, "Statistic ", statSel),
    el("label", {}, "Mode ", modeSel), answer.workers.length > 1 ? el("label", {}, "Worker ", workerSel) : null, filter);
}

function legend(domain, statistic, diagnosed) {
  const bar = el("canvas", {width: 240, height: 10, class: "mt-colorbar"});
  const g = bar.getContext("2d");
  for (let i = 0; i < 240; i++) { g.fillStyle = viridis(i / 239); g.fillRect(i, 0, 1, 10); }
  const swatch = (color, text) => el("span", {class: "mt-legend-item"},
    el("span", {class: "mt-cell-swatch", style: `background:${color}`}), " ", text);
  const [a, b] = domain ? domain.decades : [null, null];
  return el("div", {class: "mt-legend mt-ov-legend"},
    el("span", {}, `${statistic} (bucket maximum, log scale) `),
    domain ? el("span", {class: "mt-legend-item"}, `1e${a} `, bar, ` 1e${b}`) : el("span", {}, "no positive value"),
    swatch(COLORS.zero, "0"), swatch(COLORS.nan, "NaN"), swatch(COLORS.inf, "±inf"),
    swatch(COLORS.empty, "not saved"), el("span", {class: "mt-legend-item mt-finding-key"}, "▼ rule fired"),
    diagnosed ? el("span", {class: "mt-legend-item mt-onset-key"}, "┆ onset, ▭ origin (diagnosis)") : null);
}

/** Draws the overview of one run into ctx.root. */
export async function overviewPanel(ctx) {
  const s = ctx.state;
  const run = s.selected.has(s.overviewRun) ? s.overviewRun : [...s.selected][0];
  const box = el("div", {class: "mt-ov-box"});
  const head = el("div");
  const diagBox = el("div", {class: "mt-diag-box"});
  ctx.root.append(head, diagBox, box);
  note(box, "Loading the overview…");
  const width = Math.max(300, (ctx.root.clientWidth || 1000) - LABEL_W - 40);
  // a collection chosen for another run that this one lacks: this run's default
  const known = (ctx.info.get(run) || {collections: {}}).collections;
  const collection = s.collection === "" ? "*" : (s.collection && s.collection in known ? s.collection : null);
  const workers = (ctx.info.get(run) || {workers: []}).workers;
  const worker = workers.includes(s.overviewWorker) ? s.overviewWorker : "";
  const ask = () => getJSON("overview", {run, collection, statistic: s.statistic,
    mode: s.overviewMode, worker, columns: Math.min(2000, Math.floor(width))}, ctx.signal);
  let answer = await ask();
  if (!ctx.alive()) return;
  s.collection = answer.collection;
  let report = null;
  const draw = () => {
    clear(box);
    drawOverview(ctx, answer, box, report);
  };
  clear(head).append(controls(ctx, answer, draw));
  draw();
  // The diagnosis comes after the first picture (computing one reads the whole trial).
  const members = new Set(answer.rows.map((r) => r.tensor));
  const diagnosed = loadDiagnosis(ctx, run, worker, diagBox, {
    shown: (t) => members.has(t), collections: known,
    showCollection: (c) => { s.collection = c; s.filter = ""; ctx.reload(); },
  }).then((got) => {
    report = got ? got.diagnosis : null;
    if (report && ctx.alive()) draw();
  }, (err) => { if (!isAbort(err)) throw err; });
  // A first look at a long run answers within a second with the steps read so far (coarse
  // first); ask again until every step is in.
  while (!answer.complete) {
    answer = await ask();
    if (!ctx.alive()) return;
    draw();
  }
  await diagnosed;
}

function drawOverview(ctx, answer, box, report) {
  const rows = answer.rows.filter((r) => filterNames([r.tensor], ctx.state.filter).length);
  const cols = answer.starts.length;
  const info = el("div", {class: "mt-note", id: "mt-ov-info"},
    `${answer.run}: ${rows.length} of ${answer.tensors_in_collection} tensors` +
    `${answer.collection ? ` in ${answer.collection}` : ""}, ${answer.steps} global steps` +
    (answer.bucketed ? ` in ${cols} columns (each the min–max of its steps; no NaN or inf is left out)` : "") +
    (answer.damaged ? `; ${answer.damaged.length} unreadable steps left out` : "") +
    (answer.complete ? "" : ` — reading the ${answer.trial_steps} steps: a coarse picture first, it fills in…`));
  box.append(info);
  if (!rows.length || !cols) {
    box.append(el("div", {class: "mt-note"}, rows.length ? "No step saved yet." : "No tensor matches."));
    return;
  }
  const domain = logDomain(rows);
  box.append(legend(domain, answer.statistic, Boolean(report && report.found)));
  const marks = findingMarks(answer);
  const rowH = rows.length <= 60 ? 14 : Math.max(3, Math.floor(900 / rows.length));
  const plotW = Math.max(300, (box.clientWidth || 1000) - LABEL_W - 10);
  const cellW = plotW / cols;
  const H = STRIP_H + rowH * rows.length;
  const grid = el("div", {class: "mt-ov-grid", style: `height:${H}px`});
  const labels = el("div", {class: "mt-ov-labels", style: `width:${LABEL_W}px;padding-top:${STRIP_H}px`});
  if (rowH >= 10) {
    for (const r of rows) {
      const marked = marks.rows.has(r.tensor);
      labels.append(el("div", {class: `mt-ov-label${marked ? " mt-marked" : ""}`, title: r.tensor, "data-tensor": r.tensor,
        style: `height:${rowH}px;line-height:${rowH}px`, on: {click: () => ctx.openDetail(r.tensor)}},
      marked ? "! " : "", r.tensor));
    }
  } else {
    labels.append(el("div", {class: "mt-note"}, `${rows.length} rows: point at one for its name`));
  }
  const canvas = el("canvas", {class: "mt-ov-canvas", width: Math.round(plotW), height: H,
    "data-rows": rows.length, "data-columns": cols});
  const g = canvas.getContext("2d");
  const kinds = {value: 0, zero: 0, nan: 0, inf: 0, empty: 0};
  const nonfiniteCells = [];
  rows.forEach((r, i) => {
    const bad = nonfiniteByColumn(r);
    for (let c = 0; c < cols; c++) {
      const {kind, color} = cellColor(r, c, domain, bad);
      kinds[kind]++;
      g.fillStyle = color;
      g.fillRect(Math.floor(c * cellW), STRIP_H + i * rowH, Math.max(1, Math.ceil(cellW)), rowH - (rowH > 6 ? 1 : 0));
      if (kind === "nan" || kind === "inf") nonfiniteCells.push([c, i, color]);
    }
    if (marks.rows.has(r.tensor)) {
      g.strokeStyle = COLORS.inf;
      g.strokeRect(0.5, STRIP_H + i * rowH + 0.5, plotW - 1, rowH - 1);
    }
  });
  // a NaN or an infinity in one bucket of a 3-pixel row must still catch the eye: drawn last,
  // at least 4 pixels wide and tall
  for (const [c, i, color] of nonfiniteCells) {
    g.fillStyle = color;
    const w = Math.max(4, Math.ceil(cellW)), h = Math.max(4, rowH);
    g.fillRect(Math.floor(c * cellW + cellW / 2 - w / 2), STRIP_H + i * rowH + rowH / 2 - h / 2, w, h);
  }
  g.fillStyle = COLORS.inf;
  for (const c of marks.cols.keys()) {
    const x = (c + 0.5) * cellW;
    g.beginPath(); g.moveTo(x - 5, 1); g.lineTo(x + 5, 1); g.lineTo(x, STRIP_H - 1); g.fill();
  }
  canvas.dataset.kinds = JSON.stringify(kinds);
  const diag = diagnosisMarks(answer, rows, report);
  markHeatmap(diag, {grid, canvas, labels, labelW: LABEL_W, stripH: STRIP_H, rowH, cellW, height: H,
    open: (tensor) => ctx.openDetail(tensor, diag.onset)});
  const tip = el("div", {class: "mt-tip", id: "mt-ov-tip"}, "Point at a cell for its values; click a row for its detail.");
  const cellAt = (ev) => {
    const rect = canvas.getBoundingClientRect();
    const x = (ev.clientX - rect.left) * (canvas.width / rect.width);
    const y = (ev.clientY - rect.top) * (canvas.height / rect.height);
    const c = Math.min(cols - 1, Math.max(0, Math.floor(x / cellW)));
    const i = Math.floor((y - STRIP_H) / rowH);
    return {c, i, strip: y < STRIP_H};
  };
  canvas.addEventListener("mousemove", (ev) => {
    const {c, i, strip} = cellAt(ev);
    if (strip) {
      const fired = marks.cols.get(c);
      const onset = c === diag.onsetColumn ? ` — the diagnosis' onset (step ${diag.onset})` : "";
      tip.textContent = `${columnLabel(answer, c)}${fired ? `: ${fired.join(", ")} fired` : ""}${onset}`;
      return;
    }
    const r = rows[i];
    if (!r) return;
    const bad = nonfiniteByColumn(r).get(c);
    const vals = r.count[c] ? (r.low[c] === r.high[c] ? fmt(r.high[c]) : `${fmt(r.low[c])} … ${fmt(r.high[c])}`) : "not saved";
    const extra = bad ? ` — ${bad[1]} NaN, ${bad[2]} +inf, ${bad[3]} -inf` : "";
    tip.textContent = `${r.tensor} · ${columnLabel(answer, c)} · ${answer.statistic} ${vals}${extra}`;
  });
  canvas.addEventListener("click", (ev) => {
    const {i} = cellAt(ev);
    if (rows[i]) ctx.openDetail(rows[i].tensor);
  });
  grid.append(labels, canvas);
  box.append(tip, grid, axis(answer, plotW));
  if ((answer.findings || []).length) {
    box.append(el("div", {class: "mt-findings"}, answer.findings.map((f) =>
      el("div", {class: "mt-finding"}, el("b", {}, f.rule), ` fired at ${f.steps.length} steps: ${f.message || ""}`))));
  }
}

function axis(answer, plotW) {
  const cols = answer.starts.length;
  const ticks = el("div", {class: "mt-ov-axis", style: `margin-left:${LABEL_W}px;width:${Math.round(plotW)}px`});
  const n = Math.min(6, cols);
  for (let k = 0; k < n; k++) {
    const c = Math.round((k * (cols - 1)) / Math.max(1, n - 1));
    ticks.append(el("span", {class: "mt-ov-tick", style: `left:${((c + 0.5) / cols) * 100}%`}, String(answer.starts[c])));
  }
  return el("div", {}, ticks, el("div", {class: "mt-note mt-axis-title"}, "global step (mode steps on hover)"));
}
