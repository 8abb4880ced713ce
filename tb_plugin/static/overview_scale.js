// mltrace tab: the overview's colour scales, with no DOM (node's test runner checks them:
// tests/tb_plugin/js/overview_scale.test.mjs). One scale per section (a kind of tensor: weights
// and gradients never share one), shared by every run shown, so that two runs side by side
// compare by colour. Values as saved or per row are coloured on a log scale (viridis); ratios
// (relative to the first step, step to step) on a diverging one, symmetric around 1.

import {COLORS, fmt, viridis} from "./data.js";

/** Normalizations whose values are ratios around 1 (mltrace.analysis.normalize.RATIOS, and
 * "ratio": a run over the first run, the difference view). */
export const RATIOS = new Set(["first", "change", "ratio"]);

// shrinking (blue) .. 1 (pale yellow) .. growing (orange to brown); none of them is a colour
// the overview gives zero, NaN, an infinity or an empty cell
const DIVERGING = ["#08306b", "#2171b5", "#6baed6", "#fff0a8", "#fd8d3c", "#d94801", "#7f2704"];

function rgb(h) {
  return [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
}

// 255 colours: an odd count puts ×1 exactly on the middle one
const DIVERGING_LUT = Array.from({length: 255}, (_, i) => {
  const x = (i / 254) * (DIVERGING.length - 1);
  const k = Math.min(DIVERGING.length - 2, Math.floor(x));
  const [a, b] = [rgb(DIVERGING[k]), rgb(DIVERGING[k + 1])];
  return `rgb(${a.map((v, j) => Math.round(v + (b[j] - v) * (x - k))).join(",")})`;
});

/** The diverging colour of t in [-1, 1] (0: no change). */
export function diverging(t) {
  const u = (Math.min(1, Math.max(-1, t)) + 1) / 2;
  return DIVERGING_LUT[Math.round(u * 254)];
}

/** The value a cell shows: the bucket's maximum; on a ratio scale the one of its minimum and
 * maximum farther from 1 (a bucket that shrank and grew shows the larger move). */
export function cellValue(row, col, ratio) {
  const hi = row.high[col], lo = row.low[col];
  if (!ratio || hi === null || hi === undefined || hi <= 0 || lo === null || lo === undefined || lo <= 0) return hi;
  return Math.abs(Math.log10(lo)) > Math.abs(Math.log10(hi)) ? lo : hi;
}

/**
 * The colour scale of each section, over every run's rows of that kind that `keep(tensor)`
 * shows: Map kind -> {type: "log", decades: [a, b]} (whole decades around the positive values),
 * {type: "ratio", k} (log10 ratios in [-k, k]), or null when the section has no positive value.
 */
export function sectionScales(answers, normalize, keep = () => true) {
  const ratio = RATIOS.has(normalize);
  const found = new Map();
  for (const answer of answers) {
    for (const r of answer.rows) {
      if (!keep(r.tensor)) continue;
      const e = found.get(r.kind) || {lo: Infinity, hi: -Infinity, far: 0};
      found.set(r.kind, e);
      for (const side of [r.low, r.high]) {
        for (const v of side) {
          if (v === null || !(v > 0)) continue;
          if (v < e.lo) e.lo = v;
          if (v > e.hi) e.hi = v;
          e.far = Math.max(e.far, Math.abs(Math.log10(v)));
        }
      }
    }
  }
  const out = new Map();
  for (const [kind, e] of found) {
    if (!Number.isFinite(e.lo)) out.set(kind, null);
    else if (ratio) out.set(kind, {type: "ratio", k: Math.max(0.1, Math.ceil(e.far * 10 - 1e-9) / 10)});
    else {
      const a = Math.floor(Math.log10(e.lo)) || 0, b = Math.ceil(Math.log10(e.hi)) || 0;  // never -0
      out.set(kind, {type: "log", decades: [a, b === a ? a + 1 : b]});
    }
  }
  return out;
}

/** What a cell shows and in what colour: a non-finite value first (never hidden by a bucket),
 * then an empty cell, zero, then the value on its section's scale. Returns {kind, color}. */
export function cellPaint(row, col, scale, nonfinite) {
  const bad = nonfinite ? nonfinite.get(col) : undefined;
  if (bad) return bad[1] ? {kind: "nan", color: COLORS.nan} : {kind: "inf", color: COLORS.inf};
  if (!row.count[col]) return {kind: "empty", color: COLORS.empty};
  const v = cellValue(row, col, Boolean(scale && scale.type === "ratio"));
  if (v === null || v === undefined) return {kind: "empty", color: COLORS.empty};
  if (v <= 0) return {kind: "zero", color: COLORS.zero};
  if (!scale) return {kind: "value", color: viridis(0.5)};
  if (scale.type === "ratio") return {kind: "value", color: diverging(Math.log10(v) / scale.k)};
  const [a, b] = scale.decades;
  return {kind: "value", color: viridis((Math.log10(v) - a) / (b - a))};
}

/** The colour of position t in [0, 1] along a scale's colour bar. */
export function barColor(scale, t) {
  return scale && scale.type === "ratio" ? diverging(2 * t - 1) : viridis(t);
}

/** The two ends of a scale's colour bar, as text: ["1e-8", "1e-1"] or ["×0.001", "×1000"]. */
export function scaleEnds(scale) {
  if (!scale) return ["", ""];
  if (scale.type === "ratio") return [`×${fmt(10 ** -scale.k)}`, `×${fmt(10 ** scale.k)}`];
  return [`1e${scale.decades[0]}`, `1e${scale.decades[1]}`];
}

/** What the legend says of a statistic shown under a normalization. */
export function scaleTitle(statistic, normalize) {
  return {
    row: `${statistic} over its row's largest (log scale)`,
    first: `${statistic} relative to its first step (×1 = unchanged)`,
    change: `${statistic} step to step (×1 = no change)`,
    ratio: `${statistic} of each run over the first run's at the same step (×1 = the same)`,
  }[normalize] || `${statistic} (bucket maximum, log scale)`;
}
