// Unit tests of the tensor view's labels (tb_plugin/static/data.js: niceTicks, shortName) with
// node's own runner. Run by tests/tb_plugin/test_tb_diagnosis.py or: node --test tests/tb_plugin/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as d from "../../../tb_plugin/static/data.js";

test("histogram ticks are round numbers inside the range", () => {
  assert.deepEqual(d.niceTicks(-0.2973, 0.3121, 4), [-0.2, 0, 0.2]);
  assert.deepEqual(d.niceTicks(0.1, 0.7, 4), [0.2, 0.4, 0.6]);
  assert.deepEqual(d.niceTicks(0, 0.3, 4), [0, 0.1, 0.2, 0.3]);  // no 0.30000000000000004
  assert.deepEqual(d.niceTicks(1.234e-7, 9.87e-7, 4), [2e-7, 4e-7, 6e-7, 8e-7]);
  for (const [lo, hi] of [[-3.7, 12.1], [1e-9, 3e-9], [-1e6, 5e5], [0.5, 0.5000001]]) {
    const ticks = d.niceTicks(lo, hi, 4);
    assert.ok(ticks.length >= 2 && ticks.length <= 7, `${lo}..${hi}: ${ticks}`);
    assert.ok(ticks.every((v) => v >= lo && v <= hi), `${lo}..${hi}: ${ticks}`);
    assert.ok(ticks.every((v) => d.fmt(v).length <= 8), `${lo}..${hi}: ${ticks.map(d.fmt)}`);
  }
  assert.deepEqual(d.niceTicks(2, 2), [2]);
  assert.deepEqual(d.niceTicks(-1.7e308, 1.7e308), [-1.7e308, 1.7e308]);
});

test("a long tensor name keeps its start and its end", () => {
  const name = "gradient/GPT2LMHeadModel_transformer.h.11.mlp.c_proj.weight";
  const short = d.shortName(name, 40);
  assert.equal([...short].length, 40);
  assert.ok(short.endsWith("c_proj.weight") && short.startsWith("gradient/GPT2") && short.includes("…"), short);
  assert.equal(d.shortName("loss", 40), "loss");
  assert.equal([...d.shortName("权重/".repeat(30) + "λ.bias", 21)].length, 21);
  assert.ok(d.shortName("权重/".repeat(30) + "λ.bias", 21).endsWith("λ.bias"));
});
