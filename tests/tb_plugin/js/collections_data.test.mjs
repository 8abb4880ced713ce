// Unit tests of the Collections panel's data logic (tb_plugin/static/collections_data.js) with
// node's own runner. Run by tests/tb_plugin/test_tb_diagnosis.py or: node --test tests/tb_plugin/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as c from "../../../tb_plugin/static/collections_data.js";

test("collections with no tensors are folded, the others listed in order", () => {
  const answer = [{name: "biases", tensors: []}, {name: "gradients", tensors: ["gradient/w"]},
    {name: "inputs", tensors: []}, {name: "losses", tensors: ["loss"]}];
  const {shown, empty} = c.splitCollections(answer);
  assert.deepEqual(shown.map((x) => x.name), ["gradients", "losses"]);
  assert.deepEqual(empty.map((x) => x.name), ["biases", "inputs"]);
  assert.deepEqual(c.splitCollections(undefined), {shown: [], empty: []});
});

test("the folded line counts the empty collections", () => {
  assert.equal(c.emptyCollectionsText(1), "1 empty collection");
  assert.equal(c.emptyCollectionsText(3), "3 empty collections");
});
