// Unit tests of the overview's layout (tb_plugin/static/overview_rows.js) with node's own
// runner. Run by tests/tb_plugin/test_tb_overview_depth.py or: node --test tests/tb_plugin/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as r from "../../../tb_plugin/static/overview_rows.js";

const row = (tensor, kind, group) => ({tensor, kind, group, low: [], high: [], count: [], nonfinite: []});

test("natural order: numbers as numbers, as mltrace.analysis.order.natural_key", () => {
  const text = ["Sequential_0", "Sequential_10", "Sequential_100", "Sequential_102", "Sequential_2"];
  assert.deepEqual([...text].sort(r.naturalCompare),
    ["Sequential_0", "Sequential_2", "Sequential_10", "Sequential_100", "Sequential_102"]);
  assert.deepEqual(["h.10.mlp", "H.9.mlp", "h.9.attn", "h.1.mlp"].sort(r.naturalCompare), ["h.1.mlp", "h.9.attn", "H.9.mlp", "h.10.mlp"]);
  assert.deepEqual(["a", "A"].sort(r.naturalCompare), ["A", "a"]);
  assert.ok(r.naturalCompare("x", "x0") < 0);
});

test("the common prefix ends at a separator and leaves each row a name", () => {
  const gpt = ["gradient/GPT2LMHeadModel_transformer.h.0.attn.c_attn.weight", "gradient/GPT2LMHeadModel_transformer.h.11.mlp.c_fc.bias",
    "gradient/GPT2LMHeadModel_transformer.wte.weight"];
  assert.equal(r.commonPrefix(gpt), "gradient/GPT2LMHeadModel_transformer.");
  // never a bare number left: Sequential_2, not 2
  assert.equal(r.commonPrefix(["gradient/Sequential_0.bias", "gradient/Sequential_10.weight"]), "gradient/");
  assert.equal(r.commonPrefix(["layers.0.w", "layers.1.w"]), "");
  assert.equal(r.commonPrefix(["a/b.weight"]), "");  // one name keeps its whole name
  assert.equal(r.commonPrefix(["net.fc", "net.fc.bias"]), "net.");  // a name is never all prefix
  assert.equal(r.groupLabel("gradient/Sequential_4", "gradient/"), "Sequential_4");
  assert.equal(r.groupLabel("gradient/Net_h.0", "gradient/Net_h.0."), "0");
});

test("lines: one section per kind, rows in the order given, a collapsed layer is one line", () => {
  const rows = [
    row("gradient/Net_h.0.fc.weight", "gradients", "gradient/Net_h.0"), row("gradient/Net_h.0.ln.weight", "gradients", "gradient/Net_h.0"),
    row("gradient/Net_h.1.fc.weight", "gradients", "gradient/Net_h.1"), row("gradient/Net_out.weight", "gradients", "gradient/Net_out"),
    row("Net_h.0.fc.weight", "weights", "Net_h.0"), row("Net_h.1.fc.weight", "weights", "Net_h.1"),
  ];
  const {lines, sections} = r.layoutLines(rows);
  assert.deepEqual(sections.map((s) => [s.kind, s.prefix, s.count]), [["gradients", "gradient/Net_", 4], ["weights", "Net_", 2]]);
  assert.deepEqual(lines.map((l) => l.type), ["section", "row", "row", "row", "row", "section", "row", "row"]);
  assert.deepEqual(lines.filter((l) => l.type === "row").map((l) => l.label),
    ["h.0.fc.weight", "h.0.ln.weight", "h.1.fc.weight", "out.weight", "h.0.fc.weight", "h.1.fc.weight"]);
  assert.equal(lines[1].toggle, "h.0");  // the first row of a layer of two folds it
  assert.equal(lines[2].toggle, null);
  assert.equal(lines[3].toggle, null);  // a layer of one row has nothing to fold
  const key = lines[1].key;
  const folded = r.layoutLines(rows, new Set([key])).lines;
  assert.deepEqual(folded.map((l) => l.type), ["section", "group", "row", "row", "section", "row", "row"]);
  assert.deepEqual(folded[1].tensors, ["gradient/Net_h.0.fc.weight", "gradient/Net_h.0.ln.weight"]);
  assert.equal(folded[1].label, "h.0");
  assert.deepEqual(r.groupKeys(rows), [key]);
  // one kind: no section line
  assert.equal(r.layoutLines(rows.slice(0, 4)).lines.filter((l) => l.type === "section").length, 0);
});

test("the rows of several runs: the first run's order, the others' extra rows in their section", () => {
  const a = {rows: [row("g/a", "gradients", "g/a"), row("w/a", "weights", "w/a")]};
  const b = {rows: [row("g/a", "gradients", "g/a"), row("g/b", "gradients", "g/b"), row("w/a", "weights", "w/a")]};
  assert.deepEqual(r.unionRows([a, b]).map((x) => x.tensor), ["g/a", "g/b", "w/a"]);
});

test("a folded layer keeps where it went wrong: largest, smallest, every NaN", () => {
  const rows = new Map([
    ["a", {low: [1, null, 3], high: [2, null, 4], count: [1, 0, 1], nonfinite: [[1, 1, 0, 0]]}],
    ["b", {low: [0.5, 5, 1], high: [8, 6, 1], count: [1, 1, 1], nonfinite: [[1, 0, 2, 0], [2, 0, 0, 1]]}],
  ]);
  const g = r.groupRow(rows, ["a", "b", "missing"], 3);
  assert.deepEqual(g.high, [8, 6, 4]);
  assert.deepEqual(g.low, [0.5, 5, 1]);
  assert.deepEqual(g.count, [1, 1, 1]);
  assert.deepEqual(g.worst, ["b", "b", "a"]);
  assert.deepEqual(g.least, ["b", "b", "b"]);
  assert.deepEqual(g.nonfinite, [[1, 1, 2, 0], [2, 0, 0, 1]]);
});
