// mltrace tab: the model overview. Every tensor of a collection is a row, in model order (the
// order the model ran its layers), grouped by layer; buckets of global steps are columns, one
// statistic is the colour. Every selected run is shown side by side on one colour scale per kind
// of tensor (weights and gradients never share one); a normalization (per row, relative to the
// first step, step to step) shows change that absolute size hides. Rule findings are marked; a
// click on a row opens the tensor's detail view. The diagnosis (diagnosis.js) of the first run
// is shown above it, its onset step and origin tensor marked on its canvas.

import {clear, el, getJSON, isAbort, note} from "./dom.js";
import {loadDiagnosis} from "./diagnosis.js";
import {COLORS, filterNames} from "./data.js";
import {partingText} from "./difference_data.js";
import {LABEL_W, RUN_GAP, drawGrid} from "./overview_grid.js";
import {groupKeys, layoutLines, unionRows} from "./overview_rows.js";
import {barColor, scaleEnds, scaleTitle, sectionScales} from "./overview_scale.js";

/** Runs shown side by side at most (the others stay selected for the other panels). */
export const MAX_RUNS = 4;
const NORMALIZE_TEXT = {none: "as saved", row: "per row (its largest = 1)", first: "relative to the first step",
  change: "step-to-step change"};

function ensureStyle() {
  if (document.querySelector("link[data-mt-overview]")) return;
  document.head.append(el("link", {rel: "stylesheet", href: "./static/overview.css", "data-mt-overview": "1"}));
}

function select(id, options, chosen, onChange) {
  return el("select", {id, on: {change: (e) => onChange(e.target.value)}},
    options.map(([value, text]) => el("option", {value, selected: value === chosen}, text)));
}

function controls(ctx, answer, runs, view) {
  const s = ctx.state;
  const reload = (key) => (value) => { s[key] = value; ctx.reload(); };
  const modes = Object.keys((ctx.info.get(answer.run) || {modes: {}}).modes);
  const filter = el("input", {type: "search", id: "mt-ov-filter", class: "mt-filter", placeholder: "filter tensors (regex or text)",
    value: s.filter, on: {input: (e) => { s.filter = e.target.value; view.redraw(); }}});
  const all = (collapse) => el("button", {type: "button", id: collapse ? "mt-ov-collapse" : "mt-ov-expand", class: "mt-ov-button",
    on: {click: () => view.collapseAll(collapse)}}, collapse ? "collapse layers" : "expand layers");
  const ratio = view.normalize === "ratio";
  return el("section", {class: "mt-controls"},
    runs.length > 1 ? el("label", {}, "First run ", select("mt-ov-run", runs.map((r) => [r, r]), answer.run, reload("overviewRun"))) : null,
    runs.length > 1 ? el("label", {}, "Runs ", select("mt-ov-compare", [["side", "side by side"], ["ratio", `each over ${answer.run} (difference)`]],
      ratio ? "ratio" : "side", reload("overviewCompare"))) : null,
    el("label", {}, "Collection ", select("mt-ov-collection",
      [["", "(all tensors)"], ...answer.collections.map((c) => [c, c])], answer.collection, reload("collection"))),
    el("label", {}, "Statistic ", select("mt-ov-statistic", answer.statistics.map((c) => [c, c]), answer.statistic, reload("statistic"))),
    ratio ? null : el("label", {}, "Scale ", select("mt-ov-normalize", (answer.normalizations || ["none"]).map((c) => [c, NORMALIZE_TEXT[c] || c]),
      answer.normalize || "none", reload("normalize"))),
    el("label", {}, "Mode ", select("mt-ov-mode", [["", "(all modes)"], ...modes.map((m) => [m, m])], s.overviewMode, reload("overviewMode"))),
    answer.workers.length > 1 ? el("label", {}, "Worker ", select("mt-ov-worker",
      [["", "(first worker)"], ...answer.workers.map((w) => [w, w])], answer.worker || "", reload("overviewWorker"))) : null,
    filter, all(true), all(false));
}

function legend(view, statistic, diagnosed) {
  const swatch = (color, text) => el("span", {class: "mt-legend-item"},
    el("span", {class: "mt-cell-swatch", style: `background:${color}`}), " ", text);
  const shared = view.runs.length > 1 ? ` (one scale for ${view.runs.length} runs)` : "";
  const bars = view.sections.map(({kind}) => {
    const scale = view.scales.get(kind) || null;
    const bar = el("canvas", {width: 160, height: 10, class: "mt-colorbar"});
    const g = bar.getContext("2d");
    for (let i = 0; i < 160; i++) { g.fillStyle = barColor(scale, i / 159); g.fillRect(i, 0, 1, 10); }
    const [a, b] = scaleEnds(scale);
    return el("span", {class: "mt-legend-item mt-ov-scale", "data-kind": kind, "data-scale": JSON.stringify(scale)},
      view.sections.length > 1 ? `${kind}: ` : "", scale ? [`${a} `, bar, ` ${b}`] : "no positive value");
  });
  return el("div", {class: "mt-legend mt-ov-legend"},
    el("span", {}, `${scaleTitle(statistic, view.normalize)}${shared} `), bars,
    swatch(COLORS.zero, "0"), swatch(COLORS.nan, "NaN"), swatch(COLORS.inf, "±inf"),
    swatch(COLORS.empty, "not saved"), el("span", {class: "mt-legend-item mt-finding-key"}, "▼ rule fired"),
    view.normalize === "ratio" ? el("span", {class: "mt-legend-item mt-onset-key"}, "┆ where the runs part ways, ▭ the first tensor to differ")
      : diagnosed ? el("span", {class: "mt-legend-item mt-onset-key"}, "┆ onset, ▭ origin (diagnosis)") : null);
}

function infoText(answer, shown) {
  const cols = answer.starts.length;
  if (answer.against) return `${partingText(answer)} (${shown} tensors both runs hold)`;
  return `${answer.run}: ${shown} of ${answer.tensors_in_collection} tensors` +
    `${answer.collection ? ` in ${answer.collection}` : ""}, ${answer.steps} global steps` +
    (answer.bucketed ? ` in ${cols} columns (each the min–max of its steps; no NaN or inf is left out)` : "") +
    (answer.damaged ? `; ${answer.damaged.length} unreadable steps left out` : "") +
    (answer.complete ? "" : ` — reading the ${answer.trial_steps} steps: a coarse picture first, it fills in…`);
}

/** The runs shown: the chosen first run, then the other selected ones, MAX_RUNS at most. */
export function shownRuns(state) {
  const selected = [...state.selected];
  const first = selected.includes(state.overviewRun) ? state.overviewRun : selected[0];
  return [first, ...selected.filter((r) => r !== first)].slice(0, MAX_RUNS);
}

/** Draws the overview of the selected runs into ctx.root. */
export async function overviewPanel(ctx) {
  ensureStyle();
  const s = ctx.state;
  s.normalize = s.normalize || "none";
  s.collapsed = s.collapsed || new Set();
  const runs = shownRuns(s);
  const box = el("div", {class: "mt-ov-box"});
  const head = el("div");
  const diagBox = el("div", {class: "mt-diag-box"});
  ctx.root.append(head, diagBox, box);
  note(box, "Loading the overview…");
  const plotW = Math.max(300, (ctx.root.clientWidth || 1000) - LABEL_W - 40);
  // step buckets a canvas holds when `shown` runs share the width (a pixel each at most)
  const columnsFor = (shown) => Math.max(1, Math.min(2000, Math.floor((plotW - RUN_GAP * (shown - 1)) / shown)));
  const columns = columnsFor(runs.length);
  const known = (ctx.info.get(runs[0]) || {collections: {}}).collections;
  // a collection chosen for another run that this one lacks: this run's default
  const collection = s.collection === "" ? "*" : (s.collection && s.collection in known ? s.collection : null);
  const workers = (ctx.info.get(runs[0]) || {workers: []}).workers;
  const worker = workers.includes(s.overviewWorker) ? s.overviewWorker : "";
  const ask = (run, coll, who) => getJSON("overview", {run, collection: coll, statistic: s.statistic, mode: s.overviewMode,
    worker: who, normalize: s.normalize, columns}, ctx.signal);
  const firstAnswer = await ask(runs[0], collection, worker);
  if (!ctx.alive()) return;
  s.collection = firstAnswer.collection;
  const same = firstAnswer.collection === "" ? "*" : firstAnswer.collection;
  // the difference view: each other run over the first, at the same steps (the first run's
  // column would be ×1 everywhere, so it is not drawn)
  const ratio = s.overviewCompare === "ratio" && runs.length > 1;
  const askDiff = (run) => getJSON("difference", {run, against: runs[0], collection: same, statistic: s.statistic,
    mode: s.overviewMode, columns: columnsFor(runs.length - 1)}, ctx.signal);
  const again = (k) => (ratio ? askDiff(answers[k].run) : ask(answers[k].run, k ? same : collection, k ? "" : worker));
  const failed = [];
  const askOther = (run) => (ratio ? askDiff(run) : ask(run, same, "")).catch((err) => {
    if (isAbort(err)) throw err;
    failed.push(`${run}: ${err.message}`);
    return null;
  });
  const answers = ratio ? [] : [firstAnswer];
  answers.push(...(await Promise.all(runs.slice(1).map(askOther))).filter(Boolean));
  if (!ctx.alive()) return;
  if (!answers.length) { note(box, failed.join("; ")); return; }
  const view = overviewView(ctx, answers, box, failed, plotW, ratio ? "ratio" : s.normalize);
  clear(head).append(controls(ctx, firstAnswer, runs, view));
  view.redraw();
  // The diagnosis comes after the first picture (computing one reads the whole trial).
  const members = new Set(firstAnswer.rows.map((r) => r.tensor));
  const diagnosed = loadDiagnosis(ctx, runs[0], worker, diagBox, {
    shown: (t) => members.has(t), collections: known,
    showCollection: (c) => { s.collection = c; s.filter = ""; ctx.reload(); },
  }).then((got) => {
    view.report = got ? got.diagnosis : null;
    if (view.report && view.report.found && ctx.alive()) view.redraw();  // its marks
  }, (err) => { if (!isAbort(err)) throw err; });
  // A first look at a long run answers within a second with the steps read so far (coarse
  // first); ask again until every step of every run is in.
  while (answers.some((a) => !a.complete)) {
    for (let k = 0; k < answers.length; k++) {
      if (!answers[k].complete) answers[k] = await again(k);
      if (!ctx.alive()) return;
    }
    view.redraw();
  }
  await diagnosed;
}

/** What the grid shows and how it redraws (the filter, a group opened or closed), keeping the
 * box scrolled where it was. */
function overviewView(ctx, answers, box, failed, plotW, normalize) {
  const s = ctx.state;
  const view = {report: null, normalize};
  view.toggle = (key) => {
    if (s.collapsed.has(key)) s.collapsed.delete(key); else s.collapsed.add(key);
    view.redraw();
  };
  view.collapseAll = (collapse) => {
    s.collapsed = collapse ? new Set(groupKeys(unionRows(answers))) : new Set();
    view.redraw();
  };
  view.redraw = () => {
    const old = box.querySelector(".mt-ov-scroll");
    const at = old ? [old.scrollTop, old.scrollLeft] : [0, 0];
    clear(box);
    const keep = (t) => filterNames([t], s.filter).length > 0;
    const rows = unionRows(answers).filter((r) => keep(r.tensor));
    Object.assign(view, layoutLines(rows, s.collapsed), {runs: answers, plotW,
      scales: sectionScales(answers, normalize, keep)});
    const shown = (a) => a.rows.filter((r) => keep(r.tensor)).length;
    box.append(el("div", {class: "mt-note", id: "mt-ov-info"},
      [...answers.map((a) => infoText(a, shown(a))), ...failed].join("; ")));
    if (!rows.length || !answers[0].starts.length) {
      box.append(el("div", {class: "mt-note"}, rows.length ? "No step saved yet." : "No tensor matches."));
      return;
    }
    box.append(legend(view, answers[0].statistic, Boolean(view.report && view.report.found)));
    const scroll = drawGrid(ctx, view, box);
    box.append(scroll, el("div", {class: "mt-note mt-ov-hint"},
      "Point at a cell for its values; click a row for its detail; ▾ folds a layer into one line (its largest values)."));
    [scroll.scrollTop, scroll.scrollLeft] = at;
    const parted = !old && normalize === "ratio" ? scroll.querySelector(".mt-ov-label.mt-origin") : null;
    if (parted) {  // a first look at a difference: the row where the runs part ways in the middle
      const top = parted.getBoundingClientRect().top - scroll.getBoundingClientRect().top;
      scroll.scrollTop = Math.max(0, top - scroll.clientHeight / 2);
    }
    const findings = answers.flatMap((a) => (a.findings || []).map((f) => [a.run, f]));
    if (findings.length) {
      const open = (f, t) => {
        ctx.state.stepWhy = {tensor: t, step: f.first_step, text: `${f.rule}'s finding`};
        ctx.openDetail(t, Number.isInteger(f.first_step) ? f.first_step : null);
      };
      box.append(el("div", {class: "mt-findings"}, findings.map(([run, f]) => el("div", {class: "mt-finding"},
        el("b", {}, f.rule),
        `${answers.length > 1 ? ` (${run})` : ""} fired at ${f.fired_count ?? f.steps.length} steps` +
          `${f.thinned ? " (marked spread evenly)" : ""}: ${f.message || ""} `,
        (f.tensors || []).map((t) => el("button", {class: "mt-linkbutton", "data-tensor": t,
          title: `open ${t} at global step ${f.first_step}`, on: {click: () => open(f, t)}}, t))))));
    }
  };
  return view;
}
