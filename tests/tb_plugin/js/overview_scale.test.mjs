// Unit tests of the overview's colour scales (tb_plugin/static/overview_scale.js) with node's
// own runner. Run by tests/tb_plugin/test_tb_overview_depth.py or: node --test tests/tb_plugin/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as s from "../../../tb_plugin/static/overview_scale.js";
import {COLORS, viridis} from "../../../tb_plugin/static/data.js";

const row = (tensor, kind, high, low = high) => ({tensor, kind, high, low, count: high.map((v) => (v === null ? 0 : 1)), nonfinite: []});

test("one scale per kind, shared by every run shown", () => {
  const a = {rows: [row("g", "gradients", [1e-6, 1e-4]), row("w", "weights", [2, 3])]};
  const b = {rows: [row("g", "gradients", [1e-2, 0.5]), row("w", "weights", [20, 30])]};
  const scales = s.sectionScales([a, b], "none");
  assert.deepEqual(scales.get("gradients"), {type: "log", decades: [-6, 0]});
  assert.deepEqual(scales.get("weights"), {type: "log", decades: [0, 2]});
  // a run alone would have had its own scale: the shared one spans both
  assert.deepEqual(s.sectionScales([a], "none").get("gradients"), {type: "log", decades: [-6, -4]});
  // the same value is the same colour in both runs; ten times larger is brighter
  const g = scales.get("gradients");
  assert.equal(s.cellPaint(row("g", "gradients", [1e-4]), 0, g).color, s.cellPaint(row("g", "gradients", [1e-4]), 0, g).color);
  assert.equal(s.cellPaint(row("g", "gradients", [1e-3]), 0, g).color, viridis(3 / 6));
  // the filter leaves out what is not shown
  assert.deepEqual(s.sectionScales([a, b], "none", (t) => t !== "g").has("gradients"), false);
  assert.equal(s.sectionScales([{rows: [row("z", "x", [0, null])]}], "none").get("x"), null);
});

test("ratios: a diverging scale around 1, symmetric, the larger move of a bucket shown", () => {
  const a = {rows: [row("g", "gradients", [1, 0.5, 1000], [1, 0.001, 2])]};
  const scale = s.sectionScales([a], "first").get("gradients");
  assert.deepEqual(scale, {type: "ratio", k: 3});
  assert.equal(s.cellValue(a.rows[0], 1, true), 0.001);  // shrank a thousandfold, grew at most 0.5
  assert.equal(s.cellValue(a.rows[0], 1, false), 0.5);   // on a log scale: the bucket's maximum
  assert.equal(s.cellPaint(a.rows[0], 0, scale).color, s.diverging(0));  // 1: unchanged
  assert.equal(s.cellPaint(a.rows[0], 1, scale).color, s.diverging(-1));
  assert.equal(s.cellPaint(a.rows[0], 2, scale).color, s.diverging(1));
  assert.notEqual(s.diverging(-1), s.diverging(1));
  assert.deepEqual(s.scaleEnds(scale), ["×0.001", "×1000"]);
  assert.deepEqual(s.scaleEnds({type: "log", decades: [-8, -1]}), ["1e-8", "1e-1"]);
  assert.equal(s.sectionScales([{rows: [row("g", "gradients", [1, 1])]}], "change").get("gradients").k, 0.1);
  assert.match(s.scaleTitle("l2", "change"), /step to step/);
});

test("zero, NaN, infinities and empty cells keep their own colours", () => {
  const scale = {type: "log", decades: [-3, 0]};
  const r = {tensor: "t", kind: "k", low: [0, null, 1, 1], high: [0, null, 1, 1], count: [1, 0, 1, 1], nonfinite: [[2, 1, 0, 0], [3, 0, 1, 0]]};
  const bad = new Map(r.nonfinite.map((e) => [e[0], e]));
  assert.deepEqual([0, 1, 2, 3].map((c) => s.cellPaint(r, c, scale, bad).kind), ["zero", "empty", "nan", "inf"]);
  assert.deepEqual([0, 1, 2, 3].map((c) => s.cellPaint(r, c, scale, bad).color), [COLORS.zero, COLORS.empty, COLORS.nan, COLORS.inf]);
  for (let t = -1; t <= 1; t += 0.25) {
    assert.ok(![COLORS.zero, COLORS.empty, COLORS.nan, COLORS.inf].includes(s.diverging(t)));
  }
});
