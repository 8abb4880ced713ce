// Unit tests of the difference view's data logic (tb_plugin/static/difference_data.js) with node's
// own runner. Run by tests/tb_plugin/test_tb_difference.py or: node --test tests/tb_plugin/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as d from "../../../tb_plugin/static/difference_data.js";

const answer = (parting, complete = true) => ({run: "b", against: "a", complete, parting,
  starts: [0, 10, 20], ends: [9, 19, 29]});

test("a difference's column is named by both runs", () => {
  assert.equal(d.runLabel(answer(null)), "b ÷ a");
  assert.equal(d.runLabel({run: "a"}), "a");
});

test("the parting is marked at its step's column and its tensor's row", () => {
  const rows = [{tensor: "w0"}, {tensor: null}, {tensor: "w1"}];
  const m = d.partingMarks(answer({step: 12, tensor: "w1", others: []}), rows);
  assert.equal(m.onset, 12);
  assert.equal(m.onsetColumn, 1);
  assert.equal(m.origin, "w1");
  assert.equal(m.originRow, 2);
  assert.equal(m.anomalyColumn, -1);
  // not shown (filtered out): no row; no parting: no mark
  assert.equal(d.partingMarks(answer({step: 12, tensor: "w9", others: []}), rows).originRow, -1);
  assert.equal(d.partingMarks(answer(null), rows).onsetColumn, -1);
  assert.equal(d.partingMarks(answer({step: 99, tensor: "w0", others: []}), rows).onsetColumn, -1);
});

test("the parting in words, the agreement, and a run still being read", () => {
  const text = d.partingText(answer({step: 12, tensor: "w1", value: 3, reference_value: 2, ratio: 1.5, others: ["w2"]}));
  assert.equal(text, "b parts ways with a at global step 12 in w1: 2 → 3 (×1.5); 1 more tensors differ at that step");
  assert.match(d.partingText(answer({step: 3, tensor: "w1", value: "nan", reference_value: 2, ratio: "nan", others: []})),
    /2 → NaN \(×NaN\)$/);
  assert.match(d.partingText(answer(null)), /agree at every step both saved/);
  assert.match(d.partingText(answer(null, false)), /reading/);
});
