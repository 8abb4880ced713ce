// mltrace tab: the data logic, with no DOM and no chart library, so that node's own test runner
// checks it (tests/js/data.test.mjs). Everything here is a pure function of the routes' answers.

// -- numbers ----------------------------------------------------------------------------------
/** A JSON number as the backend writes it (NaN and the infinities come as strings). */
export function num(v) {
  if (typeof v === "number") return v;
  if (v === "NaN") return NaN;
  if (v === "Infinity") return Infinity;
  if (v === "-Infinity") return -Infinity;
  return NaN;
}

/** A value for a label or a table cell: 4 significant digits, exponents for tiny and huge. */
export function fmt(v) {
  if (v === null || v === undefined) return "—";
  const x = num(v);
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "+inf" : "-inf";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(2).replace("e+", "e");
  return String(Number(x.toPrecision(4)));
}

/** Round ticks for a linear axis from lo to hi: multiples of 1, 2 or 5 times a power of ten, about
 * ``count`` of them, all inside [lo, hi], free of float noise (0.30000000000000004), so that their
 * labels read 0.1, 0.2, 0.3 rather than an edge value such as 0.2973. */
export function niceTicks(lo, hi, count = 5) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi) || !(hi > lo)) return Number.isFinite(lo) ? [lo] : [];
  const raw = (hi - lo) / Math.max(1, count - 1);
  if (!Number.isFinite(raw) || raw <= 0) return [lo, hi];  // beyond float range: the ends
  const pow = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((m) => m * pow)
    .reduce((a, b) => (Math.abs(Math.log(b / raw)) < Math.abs(Math.log(a / raw)) ? b : a));
  for (;;) {  // halved until two ticks fit (a range narrower than its nearest round step)
    const ticks = [];
    for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) {
      ticks.push(Number((k * step).toPrecision(12)));
    }
    if (ticks.length >= 2) return ticks;
    step /= 2;
  }
}

/** A tick label of a log axis: whole decades as 1e-3, 0.01, 1, 100, 1e4. */
export function decadeLabel(v) {
  const e = Math.round(Math.log10(v));
  if (Math.abs(Math.log10(v) - e) > 1e-6) return fmt(v);
  if (e >= -2 && e <= 3) return String(10 ** e >= 1 ? 10 ** e : Number((10 ** e).toFixed(-e)));
  return `1e${e}`;
}

/** A y-axis tick label. On a log axis (floor given): "≤0" on the floor that holds zeros, whole
 * decades, 2x and 5x a decade, nothing between; on a linear one every tick. uPlot passes null for
 * ticks it hides. */
export function axisTick(v, floor) {
  if (v === null || v === undefined) return "";
  if (floor === null || floor === undefined) return fmt(v);
  if (v <= floor * 1.0001) return "≤0";
  const lead = v / 10 ** Math.floor(Math.log10(v) + 1e-9);
  if (Math.abs(lead - 1) < 1e-6) return decadeLabel(v);
  if (Math.abs(lead - 2) < 1e-6 || Math.abs(lead - 5) < 1e-6) return fmt(v);
  return "";
}

// -- names --------------------------------------------------------------------------------------
/** A long name cut in its middle ("GPT_blocks.1…attn.weight"), so that both its start and its
 * end (".weight" or ".bias", what tells tensors apart) stay in sight in a narrow dropdown; at most
 * ``max`` characters (code points). The whole name goes in the option's title. */
export function shortName(name, max = 60) {
  const chars = [...String(name)];
  if (chars.length <= max) return String(name);
  const tail = Math.ceil((max - 1) / 2), head = max - 1 - tail;
  return `${chars.slice(0, head).join("")}…${chars.slice(chars.length - tail).join("")}`;
}

/** The tab's filter over tensor names: a regular expression (case-insensitive, anywhere in the
 * name), or the text itself when it is not a valid one (as tb_plugin/overview.py name_filter). */
export function nameMatcher(pattern) {
  if (!pattern) return () => true;
  let rx;
  try {
    rx = new RegExp(pattern, "i");
  } catch {
    const lower = pattern.toLowerCase();
    return (name) => name.toLowerCase().includes(lower);
  }
  return (name) => rx.test(name);
}

export function filterNames(names, pattern) {
  const ok = nameMatcher(pattern);
  return names.filter((n) => ok(n));
}

// -- steps --------------------------------------------------------------------------------------
/** "210 (EVAL 10)": a global step with its mode step beside it. */
export function stepLabel(globalStep, modeLabel) {
  if (globalStep === null || globalStep === undefined) return "?";
  return modeLabel && !modeLabel.startsWith("GLOBAL") ? `${globalStep} (${modeLabel})` : String(globalStep);
}

/** "steps 200–249 (TRAIN 150 …)" for an overview column. */
export function columnLabel(overview, col) {
  const a = overview.starts[col], b = overview.ends[col];
  const mode = overview.start_modes ? overview.start_modes[col] : null;
  const range = a === b ? `step ${a}` : `steps ${a}–${b}`;
  return mode ? `${range} (${mode}${a === b ? "" : " …"})` : range;
}

// -- the overview's colour scale ----------------------------------------------------------------
export const COLORS = {empty: "#f2f2f2", zero: "#9e9e9e", nan: "#ff00ff", inf: "#d50000"};
// viridis at 9 stops
const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];

function hexToRgb(h) {
  return [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
}

function interpolate(t) {
  const x = t * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const [a, b] = [hexToRgb(VIRIDIS[i]), hexToRgb(VIRIDIS[i + 1])];
  const f = x - i;
  return `rgb(${a.map((v, k) => Math.round(v + (b[k] - v) * f)).join(",")})`;
}

// 256 colours computed once: an overview of 500 x 1000 cells asks for half a million
const LUT = Array.from({length: 256}, (_, i) => interpolate(i / 255));

/** A colour of viridis for t in [0, 1]. */
export function viridis(t) {
  return LUT[Math.round(Math.min(1, Math.max(0, t)) * 255)] || LUT[0];
}

/** The log colour scale of an overview: the decades spanned by its positive finite values. */
export function logDomain(rows) {
  let lo = Infinity, hi = -Infinity;
  for (const r of rows) {
    for (const v of r.high) if (v !== null && v > 0 && v > hi) hi = v;
    for (const v of r.low) if (v !== null && v > 0 && v < lo) lo = v;
    for (const v of r.high) if (v !== null && v > 0 && v < lo) lo = v;
  }
  if (!Number.isFinite(lo)) return null;
  let a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
  if (a === b) b = a + 1;
  return {lo: 10 ** a, hi: 10 ** b, decades: [a, b]};
}

/** What a cell shows: a non-finite value first (never hidden by a bucket), then zero, then the
 * bucket's maximum on the log scale. Returns {kind, color}. */
export function cellColor(row, col, domain, nonfinite) {
  const bad = nonfinite ? nonfinite.get(col) : undefined;
  if (bad) {
    const [, nan] = bad;
    return nan ? {kind: "nan", color: COLORS.nan} : {kind: "inf", color: COLORS.inf};
  }
  if (!row.count[col]) return {kind: "empty", color: COLORS.empty};
  const v = row.high[col];
  if (v === null) return {kind: "empty", color: COLORS.empty};
  if (v <= 0) return {kind: "zero", color: COLORS.zero};
  if (!domain) return {kind: "value", color: viridis(0.5)};
  const [a, b] = domain.decades;
  return {kind: "value", color: viridis((Math.log10(v) - a) / (b - a))};
}

/** Per row, its non-finite cells as a Map column -> [column, nan, +inf, -inf]. */
export function nonfiniteByColumn(row) {
  return new Map(row.nonfinite.map((e) => [e[0], e]));
}

/** Rows that some rule finding names, and the columns holding its fired steps. */
export function findingMarks(overview) {
  const rows = new Set(), cols = new Map();
  for (const f of overview.findings || []) {
    for (const t of f.tensors) rows.add(t);
    for (const s of f.steps) {
      const c = columnOf(overview, s);
      if (c >= 0) cols.set(c, [...(cols.get(c) || []), f.rule]);
    }
  }
  return {rows, cols};
}

/** The column holding global step s (-1 when outside the overview). */
export function columnOf(overview, s) {
  const st = overview.starts;
  if (!st.length || s < st[0] || s > overview.ends[st.length - 1]) return -1;
  let lo = 0, hi = st.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (st[mid] <= s) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// -- the detail chart ---------------------------------------------------------------------------
/** Statistics drawn first for a tensor: its own value for a scalar, else a norm (never "mean"
 * for gradients: a mean of gradients hides vanishing and exploding alike). */
export function defaultStatistics(available) {
  for (const pick of [["value"], ["l2"], ["abs_max"], ["max"], ["mean"]]) {
    if (pick.every((p) => available.includes(p))) return pick;
  }
  return available.slice(0, 1);
}

/** Every statistic in a /series answer, sorted. */
export function seriesStatistics(answer) {
  const names = new Set();
  for (const run of answer.runs) {
    for (const m of Object.values(run.modes)) {
      Object.keys(m.values).forEach((n) => names.add(n));
      for (const w of Object.values(m.workers || {})) Object.keys(w.values).forEach((n) => names.add(n));
    }
  }
  return [...names].sort();
}

/** True when a /series answer is a scalar's (a loss, a metric): no histogram for it. */
export function isScalar(answer) {
  const stats = seriesStatistics(answer);
  return stats.length > 0 && stats.every((s) => s === "value");
}

/** The lines of a /series answer: one per run, mode, worker (when split) and statistic, each
 * {label, run, mode, worker, statistic, x (global steps), modeSteps, y (numbers)}. */
export function seriesLines(answer, statistics, perWorker) {
  const lines = [];
  const several = answer.runs.filter((r) => !r.missing).length > 1;
  for (const run of answer.runs) {
    if (run.missing) continue;
    for (const [mode, data] of Object.entries(run.modes)) {
      const groups = perWorker && data.workers ? Object.entries(data.workers) : [[null, data]];
      for (const [worker, d] of groups) {
        for (const stat of statistics) {
          if (!d.values[stat]) continue;
          const label = [several ? run.run : "", mode === "GLOBAL" ? "" : mode, worker, stat].filter(Boolean).join(" · ");
          lines.push({label, run: run.run, mode, worker, statistic: stat, x: d.global_steps,
            modeSteps: d.steps, y: d.values[stat].map((v) => (v === null ? null : num(v)))});
        }
      }
    }
  }
  return lines;
}

/** The lowest positive finite value of the lines (null when none). */
function minPositive(lines) {
  let lo = Infinity;
  for (const l of lines) for (const v of l.y) if (v !== null && v > 0 && Number.isFinite(v) && v < lo) lo = v;
  return Number.isFinite(lo) ? lo : null;
}

/** The lines aligned on one x axis (the union of their global steps), as uPlot wants them.
 * On a log axis zero and negative values are drawn on a floor a decade below the lowest positive
 * value (labelled "≤0"), never dropped; non-finite values are gaps, counted per line.
 * Returns {x, ys, raw, floor, nonfinite, onFloor}: ys what is drawn, raw what hovering shows,
 * onFloor how many values sit on the floor. */
export function alignLines(lines, logY) {
  const xs = [...new Set(lines.flatMap((l) => l.x))].sort((a, b) => a - b);
  const pos = new Map(xs.map((x, i) => [x, i]));
  const lo = logY ? minPositive(lines) : null;
  const floor = logY ? 10 ** (Math.floor(Math.log10(lo === null ? 1 : lo)) - 1) : null;
  const ys = [], raw = [], nonfinite = [];
  let onFloor = 0;
  for (const l of lines) {
    const y = new Array(xs.length).fill(null), r = new Array(xs.length).fill(null);
    let bad = 0;
    l.x.forEach((x, i) => {
      const v = l.y[i];
      const k = pos.get(x);
      r[k] = v;
      if (v === null) return;
      if (!Number.isFinite(v)) { bad++; return; }
      if (logY && v <= 0) onFloor++;
      y[k] = logY && v <= 0 ? floor : v;
    });
    ys.push(y);
    raw.push(r);
    nonfinite.push(bad);
  }
  return {x: xs, ys, raw, floor, nonfinite, onFloor};
}

// -- histograms ---------------------------------------------------------------------------------
/** One value range for several histograms drawn side by side (so their shapes compare). */
export function histogramRange(answers) {
  let lo = Infinity, hi = -Infinity, cmax = 0;
  for (const a of answers) {
    for (const h of a.histograms || []) {
      for (const [l, r, c] of h) {
        lo = Math.min(lo, num(l)); hi = Math.max(hi, num(r)); cmax = Math.max(cmax, num(c));
      }
    }
  }
  if (!Number.isFinite(lo)) return null;
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  return {lo, hi, cmax};
}

/** What a histogram panel says about the steps it shows: every saved one, or which of them. */
export function histogramNote(a) {
  const shown = a.steps.length;
  if (a.downsampled) return `${shown} of the ${a.downsampled.total} steps with saved values, evenly spaced`;
  return `all ${shown} steps with saved values`;
}

// -- rules ----------------------------------------------------------------------------------------
const LOUD = new Set(["IssuesFound", "Error", "InProgress"]);

/** The Rules panel's two parts: rules to look at (findings, errors, running) and the quiet ones
 * (nothing found, nothing checked), each keeping the backend's order. */
export function splitRules(rules) {
  return {loud: rules.filter((r) => LOUD.has(r.status)), quiet: rules.filter((r) => !LOUD.has(r.status))};
}

/** "210 (EVAL 10), 220 (EVAL 11) … (40 in all)": fired steps of one execution. */
export function firedText(execution, limit = 12) {
  const parts = execution.fired.slice(0, limit).map((f) => stepLabel(f.step, f.mode ? `${f.mode} ${f.mode_step}` : null));
  const more = execution.fired_count > limit ? ` … (${execution.fired_count} in all)` : "";
  return parts.join(", ") + more;
}

/** The steps a flight recorder dump wrote ({count, steps}): "11–12 (2 steps)" when they run
 * without a gap, else the first few and the count; "—" for none. */
export function dumpStepsText(written, limit = 8) {
  const steps = (written && written.steps) || [];
  const count = written ? written.count : 0;
  if (!count || !steps.length) return "—";
  if (count === 1) return String(steps[0]);
  const last = steps[steps.length - 1];
  if (steps.length === count && last - steps[0] === count - 1) return `${steps[0]}–${last} (${count} steps)`;
  const more = count > limit ? ` … (${count} in all)` : "";
  return steps.slice(0, limit).join(", ") + more;
}

/** A time of a rule execution (seconds since the epoch) as "2026-11-24 03:40:12 UTC". */
export function timeText(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  return new Date(seconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

// -- live ------------------------------------------------------------------------------------------
/** What changed between two /run answers of a trial: new tensors, new steps, or its end. */
export function runChanged(before, after) {
  if (!before) return true;
  if (before.ended !== after.ended || before.tensors.length !== after.tensors.length) return true;
  const count = (info) => Object.values(info.modes).reduce((n, m) => n + m.steps, 0);
  return count(before) !== count(after);
}
