// Unit tests of the mltrace tab's data logic (tb_plugin/static/data.js) with node's own runner.
// Run by tests/tb_plugin/test_tb_frontend.py (so the pytest suite runs them) or: node --test tests/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as d from "../../tb_plugin/static/data.js";

test("numbers from the backend and their labels", () => {
  assert.ok(Number.isNaN(d.num("NaN")));
  assert.equal(d.num("-Infinity"), -Infinity);
  assert.equal(d.fmt(0), "0");
  assert.equal(d.fmt(1e-9), "1.00e-9");
  assert.equal(d.fmt(0.123456), "0.1235");
  assert.equal(d.fmt("NaN"), "NaN");
  assert.equal(d.fmt(Infinity), "+inf");
  assert.equal(d.fmt(null), "—");
  assert.equal(d.decadeLabel(1e-3), "1e-3");
  assert.equal(d.decadeLabel(0.01), "0.01");
  assert.equal(d.decadeLabel(100), "100");
  assert.equal(d.decadeLabel(1e6), "1e6");
  assert.equal(d.axisTick(null, 0.01), "");
  assert.equal(d.axisTick(0.01, 0.01), "≤0");
  assert.equal(d.axisTick(0.1, 0.01), "0.1");
  assert.equal(d.axisTick(0.2, 0.01), "0.2");
  assert.equal(d.axisTick(0.7, 0.01), "");
  assert.equal(d.axisTick(1e-7, 1e-9), "1e-7");
  assert.equal(d.axisTick(0.7, null), "0.7");
});

test("the name filter takes a regex, or text when it is no valid regex", () => {
  const names = ["gradient/fc1.weight", "gradient/fc1.bias", "layer[0].weight", "Conv2d_out"];
  assert.deepEqual(d.filterNames(names, "fc1\\.w"), ["gradient/fc1.weight"]);
  assert.deepEqual(d.filterNames(names, "BIAS"), ["gradient/fc1.bias"]);
  assert.deepEqual(d.filterNames(names, "[0"), ["layer[0].weight"]);
  assert.deepEqual(d.filterNames(names, "^conv"), ["Conv2d_out"]);
  assert.deepEqual(d.filterNames(names, ""), names);
});

test("steps: global with the mode step beside it", () => {
  assert.equal(d.stepLabel(210, "EVAL 10"), "210 (EVAL 10)");
  assert.equal(d.stepLabel(5, null), "5");
  assert.equal(d.stepLabel(5, "GLOBAL 5"), "5");
  const ov = {starts: [0, 10, 20], ends: [9, 19, 29], start_modes: ["TRAIN 0", "TRAIN 10", "EVAL 0"]};
  assert.equal(d.columnLabel(ov, 2), "steps 20–29 (EVAL 0 …)");
  assert.equal(d.columnOf(ov, 15), 1);
  assert.equal(d.columnOf(ov, 29), 2);
  assert.equal(d.columnOf(ov, 30), -1);
});

test("overview colours: non-finite first, zero apart, the rest on a log scale", () => {
  const row = {tensor: "g", low: [1e-9, 0, null, 0.5, 1e3], high: [1e-8, 0, null, 2, 1e3], count: [3, 2, 0, 1, 1],
    nonfinite: [[3, 1, 0, 0]]};
  const domain = d.logDomain([row]);
  assert.deepEqual(domain.decades, [-9, 3]);
  const bad = d.nonfiniteByColumn(row);
  assert.equal(d.cellColor(row, 3, domain, bad).kind, "nan");
  assert.equal(d.cellColor(row, 1, domain, bad).kind, "zero");
  assert.equal(d.cellColor(row, 2, domain, bad).kind, "empty");
  const low = d.cellColor(row, 0, domain, bad), high = d.cellColor(row, 4, domain, bad);
  assert.equal(low.kind, "value");
  assert.notEqual(low.color, high.color);
  assert.equal(high.color, d.viridis(1));
  const inf = {tensor: "h", low: [null], high: [null], count: [1], nonfinite: [[0, 0, 1, 0]]};
  assert.equal(d.cellColor(inf, 0, domain, d.nonfiniteByColumn(inf)).color, d.COLORS.inf);
  assert.equal(d.logDomain([{low: [0, null], high: [0, null]}]), null);
});

test("findings mark rows named in messages and columns of fired steps", () => {
  const ov = {starts: [0, 10], ends: [9, 19], findings: [{rule: "VanishingGradient", steps: [3, 12, 99], tensors: ["g1"]}]};
  const m = d.findingMarks(ov);
  assert.ok(m.rows.has("g1"));
  assert.deepEqual([...m.cols.keys()].sort(), [0, 1]);
});

const SERIES = {tensor: "t", runs: [
  {run: "a", modes: {TRAIN: {steps: [0, 1, 2], global_steps: [0, 1, 2], values: {l2: [1, 0, "NaN"], mean: [0, 0, 0]},
    workers: {worker_0: {steps: [0, 1, 2], global_steps: [0, 1, 2], values: {l2: [1, 0, 2]}},
      worker_1: {steps: [0, 1, 2], global_steps: [0, 1, 2], values: {l2: [3, 3, 3]}}}},
  EVAL: {steps: [0], global_steps: [3], values: {l2: [0.5]}}}},
  {run: "b", modes: {TRAIN: {steps: [0, 1], global_steps: [0, 2], values: {l2: [1e-6, 1e-7]}}}},
  {run: "c", missing: true, modes: {}},
]};

test("default statistics: a norm for tensors, the value for scalars; never mean first", () => {
  assert.deepEqual(d.defaultStatistics(["l2", "max", "mean", "min"]), ["l2"]);
  assert.deepEqual(d.defaultStatistics(["value"]), ["value"]);
  assert.deepEqual(d.defaultStatistics(["abs_max", "mean"]), ["abs_max"]);
  assert.deepEqual(d.seriesStatistics(SERIES), ["l2", "mean"]);
  assert.equal(d.isScalar(SERIES), false);
  assert.equal(d.isScalar({runs: [{run: "a", modes: {TRAIN: {values: {value: [1]}}}}]}), true);
});

test("lines for runs, modes and workers on the global step axis", () => {
  const lines = d.seriesLines(SERIES, ["l2"], false);
  assert.deepEqual(lines.map((l) => l.label), ["a · TRAIN · l2", "a · EVAL · l2", "b · TRAIN · l2"]);
  assert.deepEqual(lines[1].x, [3]);
  const split = d.seriesLines(SERIES, ["l2"], true);
  assert.deepEqual(split.map((l) => l.label), ["a · TRAIN · worker_0 · l2", "a · TRAIN · worker_1 · l2", "a · EVAL · l2", "b · TRAIN · l2"]);
  const global = {runs: [{run: "a", modes: {GLOBAL: {steps: [0], global_steps: [0], values: {l2: [1]}}}}]};
  assert.deepEqual(d.seriesLines(global, ["l2"], false).map((l) => l.label), ["l2"]);
});

test("aligned lines: a log axis keeps zeros on a floor, NaN is a gap that is counted", () => {
  const lines = d.seriesLines(SERIES, ["l2"], false);
  const lin = d.alignLines(lines, false);
  assert.deepEqual(lin.x, [0, 1, 2, 3]);
  assert.deepEqual(lin.ys[0], [1, 0, null, null]);
  assert.deepEqual(lin.ys[2], [1e-6, null, 1e-7, null]);
  assert.deepEqual(lin.nonfinite, [1, 0, 0]);
  const log = d.alignLines(lines, true);
  assert.equal(log.floor, 1e-8);
  assert.equal(log.onFloor, 1);
  assert.equal(lin.onFloor, 0);
  assert.deepEqual(log.ys[0], [1, 1e-8, null, null]);
  assert.equal(log.raw[0][1], 0);
  assert.ok(Number.isNaN(log.raw[0][2]));
});

test("histograms share one range and say which steps they show", () => {
  const a = {steps: [0, 1], histograms: [[[0, 1, 2], [1, 2, 5]], [[-1, 0, 1]]]};
  const b = {steps: [0], histograms: [[[0, 3, 7]]], downsampled: {total: 40, returned: 1}};
  assert.deepEqual(d.histogramRange([a, b]), {lo: -1, hi: 3, cmax: 7});
  assert.equal(d.histogramNote(a), "all 2 steps with saved values");
  assert.equal(d.histogramNote(b), "1 of the 40 steps with saved values, evenly spaced");
  assert.equal(d.histogramRange([{histograms: []}]), null);
});

test("rules: findings first, the quiet ones apart; fired steps with mode steps", () => {
  const rules = [{rule: "A", status: "IssuesFound"}, {rule: "B", status: "NoIssuesFound"},
    {rule: "C", status: "NothingChecked"}, {rule: "D", status: "Error"}];
  const {loud, quiet} = d.splitRules(rules);
  assert.deepEqual(loud.map((r) => r.rule), ["A", "D"]);
  assert.deepEqual(quiet.map((r) => r.rule), ["B", "C"]);
  const x = {fired_count: 14, fired: Array.from({length: 14}, (_, i) => ({step: 200 + i, mode: "EVAL", mode_step: i}))};
  assert.equal(d.firedText(x, 2), "200 (EVAL 0), 201 (EVAL 1) … (14 in all)");
  assert.equal(d.timeText(1700000000), "2023-11-14 22:13:20 UTC");
});

test("live: a run changed when tensors or steps appear or it ends", () => {
  const a = {ended: false, tensors: ["x"], modes: {TRAIN: {steps: 3}}};
  assert.equal(d.runChanged(undefined, a), true);
  assert.equal(d.runChanged(a, {...a}), false);
  assert.equal(d.runChanged(a, {...a, modes: {TRAIN: {steps: 4}}}), true);
  assert.equal(d.runChanged(a, {...a, tensors: ["x", "y"]}), true);
  assert.equal(d.runChanged(a, {...a, ended: true}), true);
});

test("the steps a flight recorder dump wrote", () => {
  assert.equal(d.dumpStepsText({count: 0, steps: []}), "—");
  assert.equal(d.dumpStepsText(null), "—");
  assert.equal(d.dumpStepsText({count: 1, steps: [14]}), "14");
  assert.equal(d.dumpStepsText({count: 3, steps: [10, 11, 12]}), "10–12 (3 steps)");
  assert.equal(d.dumpStepsText({count: 3, steps: [10, 12, 13]}), "10, 12, 13");
  assert.equal(d.dumpStepsText({count: 300, steps: [...Array(200).keys()]}, 3), "0, 1, 2 … (300 in all)");
});
