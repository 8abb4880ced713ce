// Unit tests of the diagnosis view's data logic (tb_plugin/static/diagnosis_data.js) with node's
// own runner. Run by tests/tb_plugin/test_tb_diagnosis.py or: node --test tests/tb_plugin/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as d from "../../../tb_plugin/static/diagnosis_data.js";

const overview = {starts: [0, 10, 20, 30], ends: [9, 19, 29, 39]};
const rows = [{tensor: "gradient/a"}, {tensor: "updates/h.0.c_fc.weight"}, {tensor: "loss"}];
const report = {
  found: true, onset: 12, anomaly: {step: 31, kind: "loss_spike", tensor: "loss", detail: "..."},
  origin: [{tensor: "updates/h.0.c_fc.weight", step: 12, z: "inf"}, {tensor: "loss", step: 31, z: 9.5}],
  cause: {class: "optimizer", summary: "s", advice: ["lower the rate"], evidence: [
    {cause: "data", supports: false, text: "no sample stands out"},
    {cause: "optimizer", supports: true, text: "updates left first"},
    {cause: "data", supports: true, text: "the loss moved"},
    {cause: "optimizer", supports: false, text: "Adam's state was normal"},
  ]},
};

test("the onset, the anomaly and the origin on an overview", () => {
  assert.deepEqual(d.diagnosisMarks(overview, rows, report), {
    onset: 12, onsetColumn: 1, anomalyStep: 31, anomalyColumn: 3, origin: "updates/h.0.c_fc.weight", originRow: 1,
  });
  // the anomaly at the onset: one line; an origin not among the rows, a step outside the overview
  const same = {...report, onset: 31, origin: [{tensor: "weights/x", step: 31}]};
  assert.deepEqual(d.diagnosisMarks(overview, rows, same),
    {onset: 31, onsetColumn: 3, anomalyStep: null, anomalyColumn: -1, origin: "weights/x", originRow: -1});
  assert.equal(d.diagnosisMarks(overview, rows, {...report, onset: 400}).onsetColumn, -1);
  // no anomaly, no report, a damaged one: nothing is marked
  for (const r of [null, {found: false, message: "no anomaly"}, {found: true, onset: "x", origin: "y"}]) {
    const m = d.diagnosisMarks(overview, rows, r);
    assert.equal(m.onsetColumn, -1);
    assert.equal(m.originRow, -1);
  }
});

test("the origin tensor: the origin's first, else the anomaly's", () => {
  assert.equal(d.originTensor(report), "updates/h.0.c_fc.weight");
  assert.equal(d.originTensor({...report, origin: []}), "loss");
  assert.equal(d.originTensor({found: true}), null);
});

test("the collection that shows a tensor: the smallest, all and default last", () => {
  const collections = {all: ["a", "b", "u"], default: ["u"], updates: ["u", "v"], stability: ["u", "v", "w"], weights: ["a"]};
  assert.equal(d.collectionOf(collections, "u"), "updates");
  assert.equal(d.collectionOf(collections, "b"), "all");
  assert.equal(d.collectionOf(collections, "zz"), null);
  assert.equal(d.collectionOf(undefined, "u"), null);
});

test("evidence grouped by cause, the named cause first, signs kept", () => {
  const groups = d.evidenceByCause(report);
  assert.deepEqual(groups.map((g) => [g.cause, g.named]), [["optimizer", true], ["data", false]]);
  assert.deepEqual(groups[0].items, [{supports: true, text: "updates left first"}, {supports: false, text: "Adam's state was normal"}]);
  assert.deepEqual(groups[1].items.map((e) => e.supports), [false, true]);
  assert.deepEqual(d.evidenceByCause({found: false}), []);
});

test("numbers of a report: non-finite ones as strings", () => {
  assert.equal(d.reportNumber("inf"), Infinity);
  assert.equal(d.reportNumber("-inf"), -Infinity);
  assert.ok(Number.isNaN(d.reportNumber("nan")));
  assert.equal(d.zText("inf"), "not finite");
  assert.equal(d.zText(695.437), "robust z +695.4");
  assert.equal(d.zText(-9), "robust z -9.0");
  assert.equal(d.sampleText({index: 2, loss: 14.8778, batch_median: 0.000484, fingerprint: "a5cd8b35c791c01f"}),
    "sample 2: loss 14.88 (batch median 4.84e-4), fingerprint a5cd8b35c791c01f");
  assert.equal(d.sampleText({index: 0, loss: 3, batch_median: 1}), "sample 0: loss 3 (batch median 1)");
});

test("where the report comes from", () => {
  assert.equal(d.sourceText({source: "computed", diagnosis: {worker: "worker_0"}}),
    "computed now (worker_0), not written into the trial");
  assert.equal(d.sourceText({source: "stored", stored_workers: ["worker_0", "worker_1"], diagnosis: {worker: "worker_1"}}),
    "kept in the trial (worker_1); also kept for worker_0");
});
