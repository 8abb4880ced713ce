// mltrace tab: one tensor in detail. Its statistics over global steps for every selected run (and
// worker) overlaid in one uPlot chart (hover values, drag to zoom, double-click to reset, log scale
// that keeps zeros), histograms of its saved values side by side per run and worker, and its values
// at a chosen step in a table that scrolls. Opened at a step (the diagnosis' origin links, a rule
// finding's tensors, the non-finite values), the chart marks that step and the table shows the
// values there (at the nearest saved step when the tensor saved none there).

import uPlot from "./uPlot.esm.js";
import {clear, el, getJSON, note, svgEl} from "./dom.js";
import {naturalCompare} from "./overview_rows.js";
import {
  alignLines, axisTick, defaultStatistics, filterNames, fmt, histogramNote, histogramRange, isScalar, niceTicks, shortName,
  num, seriesLines, seriesStatistics, stepLabel,
} from "./data.js";

const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
const DASHES = [[], [6, 3], [2, 3], [10, 3, 2, 3]];
const HISTOGRAM_STEPS = 60;
// whole steps only on the step axis
const STEP_INCRS = [1, 2, 5].flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7].map((d) => m * d)).sort((a, b) => a - b);
const logTick = axisTick;

/** Every tensor name of the selected runs, and the collections they are in. */
function tensorNames(ctx) {
  const names = new Set();
  for (const run of ctx.state.selected) for (const t of (ctx.info.get(run) || {tensors: []}).tensors) names.add(t);
  return [...names].sort(naturalCompare);
}

function chooser(ctx) {
  const s = ctx.state;
  const all = tensorNames(ctx);
  const select = el("select", {id: "mt-tensor", size: 1, on: {change: (e) => { s.tensor = e.target.value; ctx.reload(); }}});
  const fill = () => {
    clear(select);
    const shown = filterNames(all, s.filter);
    if (s.tensor && !shown.includes(s.tensor)) shown.unshift(s.tensor);
    select.append(el("option", {value: ""}, `(choose: ${shown.length} of ${all.length} tensors)`));
    for (const n of shown) select.append(el("option", {value: n, title: n, selected: n === s.tensor}, shortName(n)));
  };
  fill();
  const filter = el("input", {type: "search", id: "mt-filter", class: "mt-filter", placeholder: "filter tensors (regex or text)",
    value: s.filter, on: {input: (e) => { s.filter = e.target.value; fill(); }}});
  const perWorker = el("input", {type: "checkbox", id: "mt-perworker", checked: s.perWorker,
    on: {change: (e) => { s.perWorker = e.target.checked; ctx.reload(); }}});
  const logY = el("input", {type: "checkbox", id: "mt-logy", checked: s.logY,
    on: {change: (e) => { s.logY = e.target.checked; ctx.redraw(); }}});
  const maxPoints = el("input", {type: "number", id: "mt-maxpoints", min: 2, placeholder: "all", value: s.maxPoints,
    on: {change: (e) => { s.maxPoints = e.target.value; ctx.reload(); }}});
  return el("section", {class: "mt-controls"}, filter, el("label", {}, "Tensor ", select),
    el("label", {}, perWorker, " per worker"), el("label", {}, logY, " log scale"),
    el("label", {title: "Leave empty to see every saved step"}, "Points ", maxPoints));
}

/** What opened the view at its marked step, as the link said (state.stepWhy {tensor, step,
 * text}: a rule's finding, the non-finite values), else "a link" (the diagnosis' origin). */
function openedFrom(s) {
  const why = s.stepWhy;
  return why && why.tensor === s.tensor && why.step === s.step ? why.text : "a link";
}

/** The saved step of `steps` (global steps, sorted) nearest to `step`, the earlier one on a tie. */
function nearestStep(steps, step) {
  let best = null;
  for (const g of steps) if (best === null || Math.abs(g - step) < Math.abs(best - step)) best = g;
  return best;
}

/** Draws the detail view of ctx.state.tensor into ctx.root. */
export async function detailPanel(ctx) {
  const s = ctx.state;
  ctx.root.append(chooser(ctx));
  if (!s.tensor) {
    ctx.root.append(el("section", {}, el("div", {class: "mt-note"}, "Choose a tensor, or click a row of the overview.")));
    return;
  }
  const chartBox = el("section", {class: "mt-chart-section"}, el("div", {class: "mt-note"}, "Loading…"));
  let markedNote = null;
  if (Number.isInteger(s.step)) {
    markedNote = el("div", {class: "mt-note mt-marked-step", id: "mt-marked-step", "data-step": s.step},
      `Global step ${s.step} is marked: the dashed line on the chart, and the values below are at it (opened from ${openedFrom(s)}).`);
    ctx.root.append(markedNote);
  }
  const histBox = el("section", {}, el("h3", {}, "Histograms of the saved values"));
  const tableBox = el("section", {}, el("h3", {}, "Values at a step"));
  ctx.root.append(chartBox, histBox, tableBox);
  const answer = await getJSON("series", {run: [...s.selected], tensor: s.tensor, per_worker: s.perWorker ? "1" : "",
    max_points: s.maxPoints}, ctx.signal);
  if (!ctx.alive()) return;
  const stats = seriesStatistics(answer);
  if (!s.statistics || !s.statistics.some((x) => stats.includes(x))) s.statistics = defaultStatistics(stats);
  const draw = () => drawChart(ctx, answer, stats, chartBox);
  ctx.redraw = draw;
  draw();
  drawValues(ctx, answer, tableBox);
  if (markedNote) markedNote.scrollIntoView({block: "start"});
  if (isScalar(answer)) {
    histBox.append(el("div", {class: "mt-note", id: "mt-no-histogram"}, "A scalar (one value per step): no histogram."));
  } else {
    await drawHistograms(ctx, answer, histBox);
  }
}

function drawChart(ctx, answer, stats, box) {
  const s = ctx.state;
  clear(box);
  box.append(el("h3", {class: "mt-chart-title"}, `${s.tensor} — ${s.statistics.join(", ")} over global steps`));
  box.append(el("div", {class: "mt-reductions"}, stats.map((n) => el("label", {class: "mt-chip"},
    el("input", {type: "checkbox", class: "mt-reduction", value: n, checked: s.statistics.includes(n), on: {change: (e) => {
      s.statistics = e.target.checked ? [...s.statistics, n] : s.statistics.filter((x) => x !== n);
      drawChart(ctx, answer, stats, box);
    }}}), " ", n))));
  const missing = answer.runs.filter((r) => r.missing).map((r) => r.run);
  if (missing.length) box.append(el("div", {class: "mt-note"}, `Not in ${missing.join(", ")}`));
  const lines = seriesLines(answer, s.statistics, s.perWorker);
  if (!lines.length) {
    box.append(el("div", {class: "mt-note"}, "Nothing to draw: pick a statistic above."));
    return;
  }
  const al = alignLines(lines, s.logY);
  const modeOf = new Map();
  for (const l of lines) l.x.forEach((x, i) => { if (l.mode !== "GLOBAL") modeOf.set(x, `${l.mode} ${l.modeSteps[i]}`); });
  const plot = el("div", {class: "mt-uplot", id: "mt-chart"});
  box.append(plot);
  const width = Math.max(400, Math.min(1100, (box.clientWidth || 900) - 30));
  const series = [{label: "global step", value: (u, v) => (v === null ? "—" : stepLabel(v, modeOf.get(v)))}];
  lines.forEach((l, k) => series.push({
    label: l.label, stroke: PALETTE[k % PALETTE.length], width: 1.6, spanGaps: true,
    dash: DASHES[Math.floor(k / PALETTE.length) % DASHES.length],
    points: {show: l.x.length <= 60},
    value: (u, v, si, idx) => (idx === null || idx === undefined ? "—" : fmt(al.raw[si - 1][idx])),
  }));
  const yValues = (u, splits) => splits.map((v) => logTick(v, s.logY ? al.floor : null));
  const opts = {
    width, height: 340, series,
    scales: {x: {time: false}, y: s.logY ? {distr: 3, log: 10} : {}},
    axes: [{label: "global step", incrs: STEP_INCRS, values: (u, splits) => splits.map((v) => (v === null ? "" : String(v)))},
      {label: s.statistics.join(", "), values: yValues, size: 70}],
    cursor: {drag: {x: true, y: false}},
    legend: {live: true},
    hooks: {setScale: [(u, key) => {
      if (key === "x") plot.dataset.xrange = JSON.stringify([u.scales.x.min, u.scales.x.max]);
    }], draw: [(u) => markStep(u, s.step)]},
  };
  plot.dataset.log = s.logY ? "1" : "0";
  if (Number.isInteger(s.step)) plot.dataset.markedStep = String(s.step);
  const chart = new uPlot(opts, [al.x, ...al.ys], plot);
  plot.dataset.points = String(al.ys.reduce((n, y) => n + y.filter((v) => v !== null).length, 0));
  plot.dataset.lines = String(lines.length);
  const notes = lines.map((l, k) => {
    const bad = al.nonfinite[k];
    const d = answer.runs.find((r) => r.run === l.run).modes[l.mode];
    const down = d.downsampled ? `, downsampled from ${d.downsampled.total} on request` : "";
    return el("span", {class: "mt-legend-item"}, el("span", {class: "mt-swatch", style: `background:${PALETTE[k % PALETTE.length]}`}),
      ` ${l.label} (${l.x.length} steps${down}${bad ? `, ${bad} not finite` : ""})`);
  });
  box.append(el("div", {class: "mt-legend", id: "mt-lines"}, notes));
  box.append(el("div", {class: "mt-note"}, "Drag across the chart to zoom, double-click to zoom out." +
    (s.logY && al.onFloor ? ` Log scale: ${al.onFloor} values (zero or negative) sit on the line marked ≤0 (${fmt(al.floor)}).` : "")));
  return chart;
}

/** A dashed line at global step `step` over the chart (nothing when null or out of view). */
function markStep(u, step) {
  if (!Number.isInteger(step) || step < u.scales.x.min || step > u.scales.x.max) return;
  const x = Math.round(u.valToPos(step, "x", true));
  const g = u.ctx;
  g.save();
  g.strokeStyle = "#e65100";
  g.lineWidth = 2;
  g.setLineDash([5, 4]);
  g.beginPath();
  g.moveTo(x, u.bbox.top);
  g.lineTo(x, u.bbox.top + u.bbox.height);
  g.stroke();
  g.restore();
}

async function drawHistograms(ctx, answer, box) {
  const s = ctx.state;
  const wanted = [];
  for (const run of answer.runs) {
    if (run.missing) continue;
    const workers = new Set();
    for (const m of Object.values(run.modes)) Object.keys(m.workers || {}).forEach((w) => workers.add(w));
    if (s.perWorker && workers.size) [...workers].sort().forEach((w) => wanted.push({run: run.run, worker: w}));
    else wanted.push({run: run.run, worker: null});
  }
  const status = el("div", {class: "mt-note"}, "Loading…");
  box.append(status);
  const answers = await Promise.all(wanted.map((w) => getJSON("histograms", {run: w.run, tensor: s.tensor, mode: "GLOBAL",
    worker: w.worker || "", max_steps: HISTOGRAM_STEPS}, ctx.signal).catch((err) => {
    if (err.name === "AbortError") throw err;
    return {error: err.message, steps: []};
  })));
  if (!ctx.alive()) return;
  status.remove();
  const range = histogramRange(answers.filter((a) => !a.unavailable && !a.error));
  const row = el("div", {class: "mt-histo-row"});
  answers.forEach((a, k) => {
    const title = [wanted[k].run, wanted[k].worker].filter(Boolean).join(" · ");
    const cell = el("div", {class: "mt-histo-cell", "data-run": wanted[k].run}, el("h4", {}, title));
    if (a.error) cell.append(el("div", {class: "mt-error"}, a.error));
    else if (a.unavailable) cell.append(el("div", {class: "mt-note"}, a.unavailable));
    else if (!a.steps.length) cell.append(el("div", {class: "mt-note"}, "No finite value saved."));
    else cell.append(el("div", {class: "mt-note"}, histogramNote(a)), ridgeline(a, range));
    row.append(cell);
  });
  box.append(row);
}

function ridgeline(a, range) {
  const W = 420, rowH = 12, top = 34, L = 92, R = 28;  // R: room for the last tick's label
  const n = a.steps.length;
  const H = top + rowH * n + 26;
  const svg = svgEl("svg", {class: "mt-histograms", viewBox: `0 0 ${W} ${H}`, width: W, height: H});
  const {lo, hi, cmax} = range;
  const px = (x) => L + ((x - lo) / (hi - lo)) * (W - L - R);
  a.histograms.forEach((h, i) => {
    const base = top + rowH * (i + 1);
    let d = `M${px(num(h[0][0])).toFixed(1)},${base}`;
    for (const [l, r, c] of h) {
      const y = base - (num(c) / (cmax || 1)) * (rowH * 2.5);
      d += `L${px((num(l) + num(r)) / 2).toFixed(1)},${y.toFixed(1)}`;
    }
    d += `L${px(num(h[h.length - 1][1])).toFixed(1)},${base}Z`;
    const shade = Math.round(200 - (150 * i) / Math.max(1, n - 1));
    const path = svgEl("path", {d, class: "mt-ridge", fill: `rgb(${shade},${shade + 20},255)`, stroke: "#335"});
    const label = stepLabel(a.global_steps[i], a.step_modes[i]);
    const title = svgEl("title");
    title.textContent = `step ${label}`;
    path.appendChild(title);
    svg.appendChild(path);
    if (i % Math.max(1, Math.ceil(n / 12)) === 0 || i === n - 1) {
      const t = svgEl("text", {x: L - 4, y: base, class: "mt-axis", "text-anchor": "end"});
      t.textContent = label;
      svg.appendChild(t);
    }
  });
  for (const v of niceTicks(lo, hi, 4)) {
    const t = svgEl("text", {x: px(v), y: H - 6, class: "mt-axis", "text-anchor": "middle"});
    t.textContent = fmt(v);
    svg.appendChild(t);
  }
  const t = svgEl("text", {x: 4, y: 12, class: "mt-axis"});
  t.textContent = "global step (mode step)";
  svg.appendChild(t);
  return svg;
}

function drawValues(ctx, answer, box) {
  const runs = answer.runs.filter((r) => !r.missing);
  if (!runs.length) return;
  const runSel = el("select", {id: "mt-value-run"}, runs.map((r) => el("option", {value: r.run}, r.run)));
  const stepSel = el("select", {id: "mt-step"});
  const workerSel = el("select", {id: "mt-value-worker"});
  const fill = () => {
    const run = runs.find((r) => r.run === runSel.value);
    clear(stepSel);
    const steps = [];
    const workers = new Set();
    for (const [mode, m] of Object.entries(run.modes)) {
      m.global_steps.forEach((g, i) => steps.push([g, mode === "GLOBAL" ? null : `${mode} ${m.steps[i]}`]));
      Object.keys(m.workers || {}).forEach((w) => workers.add(w));
    }
    steps.sort((a, b) => a[0] - b[0]);
    for (const [g, label] of steps) stepSel.append(el("option", {value: g}, stepLabel(g, label)));
    clear(workerSel).append(el("option", {value: ""}, "(first worker)"), [...workers].sort().map((w) => el("option", {value: w}, w)));
  };
  runSel.addEventListener("change", fill);
  fill();
  // opened at a step: the values there, or at the nearest saved step when it saved none there
  const saved = [...stepSel.options].map((o) => Number(o.value));
  const at = Number.isInteger(ctx.state.step) && saved.length ? nearestStep(saved, ctx.state.step) : null;
  const marked = at !== null;
  if (marked) stepSel.value = String(at);
  const out = el("div", {class: "mt-values"});
  const near = marked && at !== ctx.state.step
    ? el("div", {class: "mt-note", id: "mt-nearest-step", "data-step": at},
      `${ctx.state.tensor} was not saved at global step ${ctx.state.step}: the values are at the nearest saved step, ${at}.`)
    : null;
  const show = el("button", {id: "mt-show-values", on: {click: async () => {
    note(out, "Loading…");
    try {
      const v = await getJSON("value", {run: runSel.value, tensor: ctx.state.tensor, step: stepSel.value, mode: "GLOBAL",
        worker: workerSel.value}, ctx.signal);
      clear(out).appendChild(valueTable(v));
    } catch (err) {
      if (err.name !== "AbortError") note(out, err.message, true);
    }
  }}}, "Show values");
  box.append(el("div", {class: "mt-controls"}, runs.length > 1 ? runSel : el("span", {}, runs[0].run),
    " global step ", stepSel, workerSel, show), near, out);
  if (marked) show.click();  // opened at a step: its values at once
}

function valueTable(v) {
  const head = el("div", {class: "mt-note"}, `step ${v.step}: shape [${v.shape.join(", ")}], ${v.dtype}, ${v.size} elements` +
    (v.truncated ? ` — too large for a table: the first ${v.preview.length} elements, flattened` : ""));
  const table = el("table", {class: "mt-table mt-valuetable"});
  const data = v.truncated ? v.preview : v.values;
  if (!Array.isArray(data)) {
    table.appendChild(el("tr", {}, el("td", {}, fmt(data))));
  } else if (!Array.isArray(data[0])) {
    data.forEach((x, i) => table.appendChild(el("tr", {}, el("th", {}, String(i)), el("td", {}, fmt(x)))));
  } else {
    const rows = data.map((row) => (Array.isArray(row) ? row.flat(Infinity) : [row]));
    table.appendChild(el("tr", {}, el("th", {}, ""), rows[0].map((_, j) => el("th", {}, String(j)))));
    rows.forEach((row, i) => table.appendChild(el("tr", {}, el("th", {}, String(i)), row.map((x) => el("td", {}, fmt(x))))));
  }
  return el("div", {}, head, el("div", {class: "mt-tablescroll"}, table));
}
