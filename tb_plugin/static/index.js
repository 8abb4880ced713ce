// mltrace for TensorBoard: the frontend of the "mltrace" tab.
//
// A plain ES module (no build step, no CDN, no inline script): TensorBoard loads it into the
// plugin's iframe, whose <base href> makes "./runs" mean /data/plugin/mltrace/runs. Every name that
// comes from a trial is put in the page with textContent or as an attribute value, never as HTML.
// Charts are hand-drawn SVG. Series are shown whole unless the user asks for fewer points.

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f"];
const DASHES = ["", "6 3", "2 3", "10 3 2 3"];
const DEFAULT_REDUCTIONS = ["value", "mean", "min", "max"];

const state = {
  panel: "tensors",
  runs: [],
  selected: new Set(),
  info: new Map(),        // run -> /run answer
  collection: "",
  tensor: "",
  mode: "",
  reductions: new Set(DEFAULT_REDUCTIONS),
  perWorker: false,
  logY: false,
  maxPoints: "",
  series: null,
};

// -- small DOM helpers ------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "on") {
      for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    } else if (v !== undefined && v !== null && v !== false) {
      node.setAttribute(k, v === true ? "" : String(v));
    }
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

async function getJSON(route, params = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => query.append(k, x));
    else if (v !== undefined && v !== null && v !== "") query.append(k, v);
  }
  const response = await fetch(`./${route}?${query.toString()}`);
  const body = await response.json().catch(() => ({error: `HTTP ${response.status}`}));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function num(v) {
  // The backend writes NaN and infinities as strings (TensorBoard's JSON cleansing).
  if (typeof v === "number") return v;
  if (v === "NaN") return NaN;
  if (v === "Infinity") return Infinity;
  if (v === "-Infinity") return -Infinity;
  return NaN;
}

function fmt(v) {
  const x = num(v);
  if (!Number.isFinite(x)) return String(v);
  if (x !== 0 && (Math.abs(x) >= 1e5 || Math.abs(x) < 1e-3)) return x.toExponential(3);
  return String(Math.round(x * 1e6) / 1e6);
}

function status(node, text, isError = false) {
  clear(node).appendChild(el("div", {class: isError ? "mt-error" : "mt-note"}, text));
}

// -- layout -----------------------------------------------------------------------------------
const ui = {};

export async function render() {
  document.head.appendChild(el("link", {rel: "stylesheet", href: "./static/style.css"}));
  const nav = el("nav", {class: "mt-nav"},
    ["tensors", "collections", "rules"].map((p) =>
      el("button", {class: "mt-tab", "data-panel": p, on: {click: () => showPanel(p)}},
        p[0].toUpperCase() + p.slice(1))));
  ui.runList = el("div", {class: "mt-runs"});
  ui.main = el("main", {class: "mt-main"});
  document.body.appendChild(el("div", {class: "mt-app"},
    el("aside", {class: "mt-side"}, el("h2", {}, "Runs"), ui.runList),
    el("div", {class: "mt-body"}, nav, ui.main)));
  try {
    const answer = await getJSON("runs");
    state.runs = answer.runs.map((r) => r.name);
  } catch (err) {
    status(ui.main, `Could not list trials: ${err.message}`, true);
    return;
  }
  if (state.runs.length) state.selected.add(state.runs[0]);
  drawRunList();
  showPanel("tensors");
}

function drawRunList() {
  clear(ui.runList);
  if (!state.runs.length) {
    ui.runList.appendChild(el("p", {class: "mt-note"},
      "No mltrace trials found. Start TensorBoard with --mltrace_logdir=DIR, or use `mltrace tensorboard DIR`."));
    return;
  }
  for (const run of state.runs) {
    const box = el("input", {type: "checkbox", class: "mt-run", value: run, checked: state.selected.has(run),
      on: {change: (e) => {
        if (e.target.checked) state.selected.add(run); else state.selected.delete(run);
        showPanel(state.panel);
      }}});
    ui.runList.appendChild(el("label", {class: "mt-runlabel", title: run}, box, " ", run));
  }
}

function showPanel(panel) {
  state.panel = panel;
  for (const b of document.querySelectorAll(".mt-tab")) {
    b.classList.toggle("mt-active", b.getAttribute("data-panel") === panel);
  }
  clear(ui.main);
  if (!state.selected.size) {
    status(ui.main, "Select a run on the left.");
    return;
  }
  if (panel === "tensors") tensorsPanel();
  else if (panel === "collections") collectionsPanel();
  else rulesPanel();
}

async function runInfo(run) {
  if (!state.info.has(run)) state.info.set(run, await getJSON("run", {run}));
  return state.info.get(run);
}

// -- Tensors panel ----------------------------------------------------------------------------
async function tensorsPanel() {
  const runs = [...state.selected];
  let infos;
  try {
    infos = await Promise.all(runs.map(runInfo));
  } catch (err) {
    status(ui.main, err.message, true);
    return;
  }
  const collections = new Map();
  for (const info of infos) {
    for (const [c, names] of Object.entries(info.collections)) {
      if (!collections.has(c)) collections.set(c, new Set());
      names.forEach((n) => collections.get(c).add(n));
    }
  }
  const all = new Set(infos.flatMap((i) => i.tensors));
  const modes = [...new Set(infos.flatMap((i) => Object.keys(i.modes)))];
  const names = () => [...(state.collection ? collections.get(state.collection) || [] : all)].sort();
  if (state.collection && !collections.has(state.collection)) state.collection = "";

  const collSel = el("select", {id: "mt-collection", on: {change: (e) => {
    state.collection = e.target.value;
    fillTensors();
  }}}, el("option", {value: ""}, "(all collections)"),
  [...collections.keys()].sort().map((c) => el("option", {value: c, selected: c === state.collection}, c)));
  const tensorSel = el("select", {id: "mt-tensor", on: {change: (e) => {
    state.tensor = e.target.value;
    loadTensor();
  }}});
  const modeSel = el("select", {id: "mt-mode", on: {change: (e) => {
    state.mode = e.target.value;
    loadTensor();
  }}}, el("option", {value: ""}, "(all modes)"), modes.map((m) => el("option", {value: m, selected: m === state.mode}, m)));
  const perWorker = el("input", {type: "checkbox", id: "mt-perworker", checked: state.perWorker, on: {change: (e) => {
    state.perWorker = e.target.checked;
    loadTensor();
  }}});
  const logY = el("input", {type: "checkbox", id: "mt-logy", checked: state.logY, on: {change: (e) => {
    state.logY = e.target.checked;
    drawSeries();
  }}});
  const maxPoints = el("input", {type: "number", id: "mt-maxpoints", min: 2, placeholder: "all", value: state.maxPoints,
    on: {change: (e) => {
      state.maxPoints = e.target.value;
      loadTensor();
    }}});

  function fillTensors() {
    clear(tensorSel).appendChild(el("option", {value: ""}, "(choose a tensor)"));
    for (const n of names()) tensorSel.appendChild(el("option", {value: n, selected: n === state.tensor}, n));
    if (!names().includes(state.tensor)) state.tensor = "";
    loadTensor();
  }

  ui.reductions = el("div", {class: "mt-reductions"});
  ui.chart = el("div", {class: "mt-chartbox"});
  ui.legend = el("div", {class: "mt-legend"});
  ui.histo = el("div", {class: "mt-histobox"});
  ui.table = el("div", {class: "mt-tablebox"});
  ui.main.appendChild(el("section", {class: "mt-controls"},
    el("label", {}, "Collection ", collSel), el("label", {}, "Tensor ", tensorSel),
    el("label", {}, "Mode ", modeSel), el("label", {}, perWorker, " per worker"),
    el("label", {}, logY, " log scale"),
    el("label", {title: "Leave empty to see every saved step"}, "Points ", maxPoints)));
  ui.main.appendChild(el("section", {},
    el("h3", {}, "Reductions over steps"), ui.reductions, ui.chart, ui.legend));
  ui.main.appendChild(el("section", {}, el("h3", {}, "Histograms over steps"), ui.histo));
  ui.main.appendChild(el("section", {}, el("h3", {}, "Values at a step"), ui.table));
  fillTensors();
}

async function loadTensor() {
  if (!ui.chart) return;
  state.series = null;
  for (const n of [ui.reductions, ui.legend, ui.histo, ui.table]) clear(n);
  if (!state.tensor) {
    status(ui.chart, "Choose a tensor.");
    return;
  }
  status(ui.chart, "Loading…");
  const wanted = state.tensor;
  try {
    const answer = await getJSON("series", {run: [...state.selected], tensor: wanted, mode: state.mode,
      per_worker: state.perWorker ? "1" : "", max_points: state.maxPoints});
    if (wanted !== state.tensor) return;
    state.series = answer;
  } catch (err) {
    status(ui.chart, err.message, true);
    return;
  }
  drawReductionChoices();
  drawSeries();
  loadHistograms();
  drawValueControls();
}

function seriesNames() {
  const names = new Set();
  for (const run of state.series.runs) {
    for (const m of Object.values(run.modes)) Object.keys(m.values).forEach((n) => names.add(n));
  }
  return [...names].sort();
}

function drawReductionChoices() {
  const names = seriesNames();
  if (!names.some((n) => state.reductions.has(n))) names.slice(0, 3).forEach((n) => state.reductions.add(n));
  clear(ui.reductions);
  for (const n of names) {
    ui.reductions.appendChild(el("label", {class: "mt-chip"},
      el("input", {type: "checkbox", class: "mt-reduction", value: n, checked: state.reductions.has(n),
        on: {change: (e) => {
          if (e.target.checked) state.reductions.add(n); else state.reductions.delete(n);
          drawSeries();
        }}}), " ", n));
  }
}

function drawSeries() {
  if (!state.series) return;
  const lines = [];
  const runs = state.series.runs;
  runs.forEach((run, ri) => {
    if (run.missing) return;
    Object.entries(run.modes).forEach(([mode, data], mi) => {
      const groups = state.perWorker && data.workers ? Object.entries(data.workers) : [["", data]];
      groups.forEach(([worker, d], wi) => {
        for (const name of Object.keys(d.values)) {
          if (!state.reductions.has(name)) continue;
          const label = [runs.length > 1 ? run.run : "", mode, worker, name].filter(Boolean).join(" · ");
          lines.push({label, steps: d.global_steps, values: d.values[name].map(num),
            color: PALETTE[(lines.length) % PALETTE.length], dash: DASHES[(ri + mi + wi) % DASHES.length],
            downsampled: d.downsampled});
        }
      });
    });
  });
  clear(ui.chart);
  clear(ui.legend);
  const missing = runs.filter((r) => r.missing).map((r) => r.run);
  if (missing.length) ui.legend.appendChild(el("div", {class: "mt-note"}, `Not in ${missing.join(", ")}`));
  if (!lines.length) {
    status(ui.chart, "Nothing to draw: pick a reduction above.");
    return;
  }
  ui.chart.appendChild(lineChart(lines, state.logY));
  for (const line of lines) {
    const bad = line.values.filter((v) => !Number.isFinite(v)).length;
    ui.legend.appendChild(el("span", {class: "mt-legend-item"},
      el("span", {class: "mt-swatch", style: `background:${line.color}`}), " ", line.label,
      ` (${line.steps.length} steps${line.downsampled ? `, downsampled from ${line.downsampled.total} on request` : ""}` +
      `${bad ? `, ${bad} not finite` : ""})`));
  }
}

function lineChart(lines, logY) {
  const W = 860, H = 320, L = 64, R = 16, T = 12, B = 36;
  const svg = svgEl("svg", {class: "mt-chart", viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img"});
  const tx = (v) => (logY ? (v > 0 ? Math.log10(v) : NaN) : v);
  let xs = [], ys = [];
  for (const l of lines) {
    xs = xs.concat(l.steps);
    ys = ys.concat(l.values.map(tx).filter(Number.isFinite));
  }
  const lo = (a) => a.reduce((m, v) => (v < m ? v : m), Infinity);
  const hi = (a) => a.reduce((m, v) => (v > m ? v : m), -Infinity);
  let [x0, x1] = [lo(xs), hi(xs)];
  let [y0, y1] = ys.length ? [lo(ys), hi(ys)] : [0, 1];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  svg.appendChild(svgEl("rect", {x: L, y: T, width: W - L - R, height: H - T - B, class: "mt-plot"}));
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + ((y1 - y0) * i) / 4;
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: py(yv), y2: py(yv), class: "mt-grid"}));
    const yl = svgEl("text", {x: L - 6, y: py(yv) + 4, class: "mt-axis", "text-anchor": "end"});
    yl.textContent = logY ? `1e${yv.toFixed(1)}` : fmt(yv);
    svg.appendChild(yl);
  }
  const xticks = new Set();
  const xstep = Math.max(1, Math.ceil((x1 - x0) / 8));
  for (let xv = Math.ceil(x0); xv <= x1; xv += xstep) xticks.add(xv);
  for (const xv of xticks) {
    if (xv < x0 || xv > x1) continue;
    const xl = svgEl("text", {x: px(xv), y: H - B + 16, class: "mt-axis", "text-anchor": "middle"});
    xl.textContent = String(xv);
    svg.appendChild(xl);
  }
  const xt = svgEl("text", {x: (L + W - R) / 2, y: H - 4, class: "mt-axis", "text-anchor": "middle"});
  xt.textContent = "global step";
  svg.appendChild(xt);
  let points = 0;
  for (const l of lines) {
    let d = "", pen = false;
    l.steps.forEach((s, i) => {
      const y = tx(l.values[i]);
      if (!Number.isFinite(y)) { pen = false; return; }
      d += `${pen ? "L" : "M"}${px(s).toFixed(1)},${py(y).toFixed(1)}`;
      pen = true;
      points++;
    });
    if (l.steps.length === 1 || d.split("M").length - 1 === l.steps.length) {
      // isolated points: draw dots so single steps are visible
      l.steps.forEach((s, i) => {
        const y = tx(l.values[i]);
        if (Number.isFinite(y)) svg.appendChild(svgEl("circle", {cx: px(s), cy: py(y), r: 3, fill: l.color}));
      });
    }
    const path = svgEl("path", {d, class: "mt-series", stroke: l.color, "stroke-dasharray": l.dash, fill: "none"});
    const title = svgEl("title");
    title.textContent = l.label;
    path.appendChild(title);
    svg.appendChild(path);
  }
  svg.setAttribute("data-points", String(points));
  return svg;
}

async function loadHistograms() {
  const run = state.series.runs.find((r) => !r.missing);
  if (!run) return;
  const mode = state.mode || Object.keys(run.modes)[0];
  if (!mode) return;
  status(ui.histo, "Loading…");
  let answer;
  try {
    answer = await getJSON("histograms", {run: run.run, tensor: state.tensor, mode, max_steps: 40});
  } catch (err) {
    status(ui.histo, err.message, true);
    return;
  }
  clear(ui.histo);
  if (answer.unavailable) {
    status(ui.histo, answer.unavailable);
    return;
  }
  const note = answer.downsampled
    ? `${run.run} · ${mode}: ${answer.steps.length} of ${answer.downsampled.total} steps (evenly spaced, as requested)`
    : `${run.run} · ${mode}: ${answer.steps.length} steps`;
  ui.histo.appendChild(el("div", {class: "mt-note"}, note));
  ui.histo.appendChild(ridgeline(answer));
}

function ridgeline(answer) {
  const W = 860, rowH = 14, top = 40, L = 64, R = 16;
  const n = answer.steps.length;
  const H = top + rowH * n + 30;
  const svg = svgEl("svg", {class: "mt-histograms", viewBox: `0 0 ${W} ${H}`, width: "100%"});
  let lo = Infinity, hi = -Infinity, cmax = 0;
  for (const h of answer.histograms) {
    for (const [l, r, c] of h) { lo = Math.min(lo, num(l)); hi = Math.max(hi, num(r)); cmax = Math.max(cmax, num(c)); }
  }
  if (lo === hi) { lo -= 1; hi += 1; }
  const px = (x) => L + ((x - lo) / (hi - lo)) * (W - L - R);
  answer.histograms.forEach((h, i) => {
    const base = top + rowH * (i + 1);
    let d = `M${px(num(h[0][0])).toFixed(1)},${base}`;
    for (const [l, r, c] of h) {
      const y = base - (num(c) / (cmax || 1)) * (rowH * 2.5);
      d += `L${px((num(l) + num(r)) / 2).toFixed(1)},${y.toFixed(1)}`;
    }
    d += `L${px(num(h[h.length - 1][1])).toFixed(1)},${base}Z`;
    const shade = Math.round(200 - (150 * i) / Math.max(1, n - 1));
    const path = svgEl("path", {d, class: "mt-ridge", fill: `rgb(${shade},${shade + 20},255)`, stroke: "#335"});
    const title = svgEl("title");
    title.textContent = `step ${answer.steps[i]}`;
    path.appendChild(title);
    svg.appendChild(path);
    if (i % Math.max(1, Math.ceil(n / 10)) === 0) {
      const t = svgEl("text", {x: L - 6, y: base, class: "mt-axis", "text-anchor": "end"});
      t.textContent = String(answer.steps[i]);
      svg.appendChild(t);
    }
  });
  for (const v of [lo, (lo + hi) / 2, hi]) {
    const t = svgEl("text", {x: px(v), y: H - 8, class: "mt-axis", "text-anchor": "middle"});
    t.textContent = fmt(v);
    svg.appendChild(t);
  }
  return svg;
}

function drawValueControls() {
  const run = state.series.runs.find((r) => !r.missing);
  if (!run) return;
  const modes = Object.keys(run.modes);
  const modeSel = el("select", {id: "mt-value-mode"}, modes.map((m) => el("option", {value: m}, m)));
  const stepSel = el("select", {id: "mt-step"});
  const fillSteps = () => {
    clear(stepSel);
    const steps = (run.modes[modeSel.value] || {steps: []}).steps;
    for (const s of steps) stepSel.appendChild(el("option", {value: s}, String(s)));
  };
  modeSel.addEventListener("change", fillSteps);
  fillSteps();
  const out = el("div", {class: "mt-values"});
  const show = el("button", {id: "mt-show-values", on: {click: async () => {
    status(out, "Loading…");
    try {
      const v = await getJSON("value", {run: run.run, tensor: state.tensor, step: stepSel.value, mode: modeSel.value});
      clear(out).appendChild(valueTable(v));
    } catch (err) {
      status(out, err.message, true);
    }
  }}}, "Show values");
  ui.table.appendChild(el("div", {class: "mt-controls"}, el("span", {}, run.run, " "), modeSel, " step ", stepSel, " ", show));
  ui.table.appendChild(out);
}

function valueTable(v) {
  const box = el("div", {});
  box.appendChild(el("div", {class: "mt-note"}, `shape [${v.shape.join(", ")}], ${v.dtype}, ${v.size} elements` +
    (v.truncated ? ` — too large for a table: the first ${v.preview.length} elements, flattened` : "")));
  const table = el("table", {class: "mt-table mt-valuetable"});
  const data = v.truncated ? v.preview : v.values;
  if (!Array.isArray(data)) {
    table.appendChild(el("tr", {}, el("td", {}, fmt(data))));
  } else if (!Array.isArray(data[0])) {
    data.forEach((x, i) => table.appendChild(el("tr", {}, el("th", {}, String(i)), el("td", {}, fmt(x)))));
  } else {
    const flat2 = data.map((row) => (Array.isArray(row) ? row.flat(Infinity) : [row]));
    table.appendChild(el("tr", {}, el("th", {}, ""), flat2[0].map((_, j) => el("th", {}, String(j)))));
    flat2.forEach((row, i) => table.appendChild(el("tr", {}, el("th", {}, String(i)), row.map((x) => el("td", {}, fmt(x))))));
  }
  box.appendChild(table);
  return box;
}

// -- Collections panel ------------------------------------------------------------------------
function saveConfigText(sc) {
  return Object.entries(sc).map(([mode, c]) => {
    const parts = [`every ${c.save_interval}`];
    if (c.save_steps && c.save_steps.length) parts.push(`steps ${c.save_steps.join(",")}`);
    if (c.start_step) parts.push(`from ${c.start_step}`);
    if (c.end_step !== null && c.end_step !== undefined) parts.push(`until ${c.end_step}`);
    return `${mode}: ${parts.join(", ")}`;
  }).join("\n");
}

// One section per selected run, filled by render(run, section); an error shows in its section.
async function perRunSections(render) {
  for (const run of state.selected) {
    const section = el("section", {class: "mt-run-section"}, el("h3", {}, run));
    ui.main.appendChild(section);
    try {
      await render(run, section);
    } catch (err) {
      section.appendChild(el("div", {class: "mt-error"}, err.message));
    }
  }
}

async function collectionsPanel() {
  await perRunSections(async (run, section) => {
    const answer = await getJSON("collections", {run});
    const table = el("table", {class: "mt-table mt-collections"},
      el("tr", {}, ["Collection", "Include regexes", "Save config", "Reductions", "Histogram", "Tensors"].map((h) => el("th", {}, h))));
    for (const c of answer.collections) {
      const rc = c.reduction_config;
      const reds = [rc.reductions, rc.mltrace_reductions].filter(Boolean).join(",") || "(none)";
      table.appendChild(el("tr", {},
        el("td", {class: "mt-name"}, c.name),
        el("td", {}, c.include_regex.length ? c.include_regex.map((r) => el("code", {}, r)) : "—"),
        el("td", {class: "mt-pre"}, saveConfigText(c.save_config)),
        el("td", {}, `${reds}${rc.save_raw_tensor ? "; raw tensor" : ""}${rc.save_shape ? "; shape" : ""}`),
        el("td", {}, c.save_histogram ? "yes" : "no"),
        el("td", {}, el("details", {}, el("summary", {}, `${c.tensors.length} tensors`),
          el("ul", {}, c.tensors.map((t) => el("li", {}, t)))))));
    }
    section.appendChild(table);
  });
}

// -- Rules panel ------------------------------------------------------------------------------
async function rulesPanel() {
  await perRunSections(async (run, section) => {
    const answer = await getJSON("rules", {run});
    if (!answer.rules.length) {
      section.appendChild(el("div", {class: "mt-note"}, "No rule has run on this trial yet (python -m mltrace.rules.rule_invoker --trial-dir ... --rule-name ...)."));
      return;
    }
    const table = el("table", {class: "mt-table mt-rules"},
      el("tr", {}, ["Rule", "Status", "Fired at steps", "Message", "Parameters", "MLflow"].map((h) => el("th", {}, h))));
    for (const r of answer.rules) {
      const fired = r.fired_steps.length > 20 ? `${r.fired_steps.slice(0, 20).join(", ")} … (${r.fired_steps.length})` : r.fired_steps.join(", ");
      table.appendChild(el("tr", {},
        el("td", {class: "mt-name"}, r.rule),
        el("td", {}, el("span", {class: `mt-status mt-status-${r.status}`}, r.status)),
        el("td", {}, fired || "—", el("div", {class: "mt-note"}, `${r.evaluated_steps} steps evaluated`)),
        el("td", {}, r.message || r.error || "—"),
        el("td", {class: "mt-pre"}, JSON.stringify(r.parameters, null, 1)),
        el("td", {}, r.mlflow_url ? el("a", {href: r.mlflow_url, target: "_blank", rel: "noopener noreferrer"}, "run") : (r.mlflow_run_id || "—"))));
    }
    section.appendChild(table);
  });
}
