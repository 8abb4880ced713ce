// Unit tests of the Rules panel's data logic (tb_plugin/static/rules_data.js) with node's own
// runner. Run by tests/tb_plugin/test_tb_findings.py or: node --test tests/tb_plugin/js/
import test from "node:test";
import assert from "node:assert/strict";
import * as r from "../../../tb_plugin/static/rules_data.js";

const GRAD = "gradient/Sequential_0.bias";

test("a message is cut into text and the tensors it names", () => {
  const message = `${GRAD} holds NaN at step 10; so does loss.`;
  const parts = r.messageParts(message, [[0, GRAD.length, GRAD], [message.length - 5, message.length - 1, "loss"]]);
  assert.deepEqual(parts, [{text: GRAD, tensor: GRAD}, {text: " holds NaN at step 10; so does "}, {text: "loss", tensor: "loss"}, {text: "."}]);
  assert.equal(parts.map((p) => p.text).join(""), message);
});

test("mentions count code points, and ones that do not fit leave the message whole", () => {
  const message = "🔥 w is NaN";
  assert.deepEqual(r.messageParts(message, [[2, 3, "w"]]), [{text: "🔥 "}, {text: "w", tensor: "w"}, {text: " is NaN"}]);
  assert.deepEqual(r.messageParts("w is NaN", [[0, 1, "x"], [5, 99, "w"]]), [{text: "w is NaN"}]);
  assert.deepEqual(r.messageParts(null, []), []);
  assert.deepEqual(r.messageParts("plain", undefined), [{text: "plain"}]);
});

test("a finding opens its tensors at its first fired step", () => {
  assert.equal(r.findingStep({first: {step: 10, mode: "TRAIN", mode_step: 10}}), 10);
  assert.equal(r.findingStep({first: null}), null);
});

test("the non-finite section's words", () => {
  assert.equal(r.kindText("inf"), "+inf");
  assert.equal(r.kindText(null), "non-finite");
  assert.equal(r.nonfiniteStep({step: 7, mode: "TRAIN", mode_step: 7}), "7 (TRAIN 7)");
  const one = {tensors: [{tensor: "loss"}], complete: true, checked: 3, total: 3};
  assert.equal(r.nonfiniteTitle(one), "Non-finite values: 1 tensor held a NaN or an infinity");
  assert.equal(r.nonfiniteTitle({tensors: [], complete: true, checked: 3, total: 3}), "No NaN or infinity in the 3 tensors saved");
  assert.match(r.nonfiniteTitle({tensors: [], complete: false, checked: 1, total: 3}), /looked at 1 of 3 tensors/);
});
