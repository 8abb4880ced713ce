"""Seed 002 (the MXNet tensor-analysis notebook): its custom rules run unchanged on mltrace.

The seven rules below are the notebook's code, copied verbatim; only the imports changed from
``smdebug`` to ``mltrace`` (and the notebook-only ``utils`` / ``IPython`` imports, used for its
plots, are left out). ``MyCustomRule`` is the notebook's sketch with its evident typos fixed: the
missing parenthesis of ``np.max(...)``, and ``return False`` indented into the method (as
printed, it sits in the class body, a SyntaxError).

The trial is a small Gluon CNN named like the notebook's (conv0/conv1 with ReLU, so that
``conv0_relu_input_0``, ``gradient/conv0_weight`` and ``.*relu_output`` exist), saved by a hook
built from smdebug's JSON configuration as the notebook's ``DebuggerHookConfig`` makes it
(collection ``all``, ``include_regex`` ``.*``, a ``save_interval``). Each rule runs in the
notebook's loop: ``invoke_rule(rule)`` until the finished trial raises ``NoMoreData``.
"""

# ruff: noqa: E501, E722, F401, I001

from mltrace.trials import create_trial
from mltrace.rules.rule_invoker import invoke_rule
from mltrace.exceptions import NoMoreData
from mltrace.rules.rule import Rule
import numpy as np
import collections
import os

import json
import logging

import pytest
from mxnet_models import batch, build_cnn, param_names, train

import mltrace.mxnet as smd


class MyCustomRule(Rule):
    def __init__(self, base_trial):
        super().__init__(base_trial)

    def invoke_at_step(self, step):
        if np.max(self.base_trial.tensor('conv0_relu_output_0').value(step)) < 0.001:
            return True
        return False


class ActivationOutputs(Rule):
    def __init__(self, base_trial):
        super().__init__(base_trial)
        self.tensors = collections.OrderedDict()

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(regex='.*relu_output'):
            if "gradients" not in tname:
                try:
                    tensor = self.base_trial.tensor(tname).value(step)
                    if tname not in self.tensors:
                        self.tensors[tname] = collections.OrderedDict()
                    if step not in self.tensors[tname]:
                        self.tensors[tname][step] = 0
                    neg_values = np.where(tensor <= 0)[0]
                    if len(neg_values) > 0:
                        self.logger.info(f" Step {step} tensor  {tname}  has {len(neg_values)/tensor.size*100}% activation outputs which are smaller than 0 ")
                    batch_over_sum = np.sum(tensor, axis=0)/tensor.shape[0]
                    self.tensors[tname][step] += batch_over_sum
                except:
                    self.logger.warning(f"Can not fetch tensor {tname}")
        return False


class ActivationInputs(Rule):
    def __init__(self, base_trial):
        super().__init__(base_trial)
        self.tensors = collections.OrderedDict()

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(regex='.*relu_input'):
            if "gradients" not in tname:
                try:
                    tensor = self.base_trial.tensor(tname).value(step)
                    if tname not in self.tensors:
                        self.tensors[tname] = {}
                    if step not in self.tensors[tname]:
                        self.tensors[tname][step] = 0
                    neg_values = np.where(tensor <= 0)[0]
                    if len(neg_values) > 0:
                        self.logger.info(f" Tensor  {tname}  has {len(neg_values)/tensor.size*100}% activation inputs which are smaller than 0 ")
                    batch_over_sum = np.sum(tensor, axis=0)/tensor.shape[0]
                    self.tensors[tname][step] += batch_over_sum
                except:
                    self.logger.warning(f"Can not fetch tensor {tname}")
        return False


class GradientsLayer(Rule):
    def __init__(self, base_trial):
        super().__init__(base_trial)
        self.tensors = collections.OrderedDict()

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(regex='.*gradient'):
            try:
                tensor = self.base_trial.tensor(tname).value(step)
                if tname not in self.tensors:
                    self.tensors[tname] = {}

                self.logger.info(f" Tensor  {tname}  has gradients range: {np.min(tensor)} {np.max(tensor)} ")
                self.tensors[tname][step] = tensor
            except:
                self.logger.warning(f"Can not fetch tensor {tname}")
        return False


class GradientsAcrossLayers(Rule):
    def __init__(self, base_trial, ):
        super().__init__(base_trial)
        self.tensors = collections.OrderedDict()

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(regex='.*gradient'):
            try:
                tensor = self.base_trial.tensor(tname).value(step)
                if step not in self.tensors:
                    self.tensors[step] = [np.inf, 0]
                variance = np.var(tensor.flatten())
                if variance < self.tensors[step][0]:
                    self.tensors[step][0] = variance
                elif variance > self.tensors[step][1]:
                    self.tensors[step][1] = variance
                self.logger.info(f" Step {step} current ratio: {self.tensors[step][0]} {self.tensors[step][1]} Ratio: {self.tensors[step][1] / self.tensors[step][0]}")
            except:
                self.logger.warning(f"Can not fetch tensor {tname}")
        return False


class WeightRatio(Rule):
    def __init__(self, base_trial, ):
        super().__init__(base_trial)
        self.tensors = collections.OrderedDict()

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(regex='.*weight'):
            if "gradient" not in tname:
                try:
                    tensor = self.base_trial.tensor(tname).value(step)
                    if tname not in self.tensors:
                        self.tensors[tname] = {}

                    self.logger.info(f" Tensor  {tname}  has weights with variance: {np.var(tensor.flatten())} ")
                    self.tensors[tname][step] = tensor
                except:
                    self.logger.warning(f"Can not fetch tensor {tname}")
        return False


class Inputs(Rule):
    def __init__(self, base_trial, ):
        super().__init__(base_trial)
        self.tensors = collections.OrderedDict()

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(regex='.*input'):
            if "relu" not in tname:
                try:
                    tensor = self.base_trial.tensor(tname).value(step)
                    if tname not in self.tensors:
                        self.tensors[tname] = {}

                    self.logger.info(f" Tensor  {tname}  has inputs with variance: {np.var(tensor.flatten())} ")
                    self.tensors[tname][step] = tensor
                except:
                    self.logger.warning(f"Can not fetch tensor {tname}")
        return False


class Outputs(Rule):
    def __init__(self, base_trial, ):
        super().__init__(base_trial)
        self.tensors = collections.OrderedDict()

    def invoke_at_step(self, step):
        for tname in self.base_trial.tensor_names(regex='.*output'):
            if "relu" not in tname:
                try:
                    tensor = self.base_trial.tensor(tname).value(step)
                    if tname not in self.tensors:
                        self.tensors[tname] = {}

                    self.logger.info(f" Tensor  {tname}  has inputs with variance: {np.var(tensor.flatten())} ")
                    self.tensors[tname][step] = tensor
                except:
                    self.logger.warning(f"Can not fetch tensor {tname}")
        return False


SAVED_STEPS = [0, 2, 4]  # 5 TRAIN steps, save_interval 2
BLOCKS = ["conv0", "pool0", "conv1", "flatten0", "dense0", "hybridsequential0"]


def _train(out_dir, tmp_path, dead_relu=False):
    """Train the CNN with a hook made from the notebook's debugger configuration."""
    config = tmp_path / f"debughookconfig_{dead_relu}.json"
    config.write_text(json.dumps({
        "LocalPath": str(out_dir),
        "CollectionConfigurations": [{"CollectionName": "all", "CollectionParameters": {
            "include_regex": ".*", "save_interval": "2"}}],
    }))
    net, loss_fn = build_cnn()
    if dead_relu:  # every conv0 ReLU input negative: its outputs are all 0, for good
        net(batch(net, 0)[0])  # ends MXNet's deferred initialization
        net[0].bias.set_data(net[0].bias.data() - 100)
    hook = smd.Hook.create_from_json_file(str(config))
    hook.register_block(net)
    hook.register_block(loss_fn)
    expected, _ = train(net, loss_fn, [("TRAIN", 5)], hook.set_mode,
                        io_blocks=[net[0].act, net[2].act])
    hook.close()
    return expected, param_names(net)


@pytest.fixture(scope="module")
def notebook_trial(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("seed002")
    expected, params = _train(tmp_path / "trial1", tmp_path)
    return create_trial(str(tmp_path / "trial1")), expected, params


def _run_as_the_notebook(rule):
    """The notebook's cell: invoke_rule until NoMoreData, which it expects."""
    ended = False
    try:
        invoke_rule(rule)
    except NoMoreData:
        print('The training has ended and there is no more data to be analyzed. This is expected behavior.')
        ended = True
    assert ended, "invoke_rule must end with NoMoreData on a finished trial"
    assert [s for s, _ in rule.evaluations] == SAVED_STEPS
    return rule


def test_seed002_trial_has_the_notebooks_names(notebook_trial):
    trial = notebook_trial[0]
    assert trial.steps() == SAVED_STEPS
    names = trial.tensor_names()
    assert {"conv0_relu_input_0", "conv1_relu_input_0", "gradient/conv0_weight",
            "gradient/conv1_weight"} <= set(names)
    assert trial.tensor_names(regex='.*relu_output') == ["conv0_relu_output_0", "conv1_relu_output_0"]


def test_seed002_activation_rules(notebook_trial, caplog):
    trial, expected, _ = notebook_trial
    with caplog.at_level(logging.INFO, logger="mltrace.rules"):
        outputs = _run_as_the_notebook(ActivationOutputs(trial))
        inputs = _run_as_the_notebook(ActivationInputs(trial))
    assert "Can not fetch tensor" not in caplog.text
    assert list(outputs.tensors) == ["conv0_relu_output_0", "conv1_relu_output_0"]
    assert list(inputs.tensors) == ["conv0_relu_input_0", "conv1_relu_input_0"]
    for rule in (outputs, inputs):
        for tname, per_step in rule.tensors.items():
            assert list(per_step) == SAVED_STEPS
            for step, value in per_step.items():
                raw = expected[("TRAIN", step)][tname]
                np.testing.assert_allclose(value, np.sum(raw, axis=0) / raw.shape[0], rtol=1e-6)
    # The notebook's comparison cell.
    dict_activation_inputs = {}
    dict_activation_inputs['conv0_relu_input_0_bad_hyperparameters'] = inputs.tensors['conv0_relu_input_0']
    dict_activation_inputs['conv1_relu_input_0_bad_hyperparameters'] = inputs.tensors['conv1_relu_input_0']
    assert all(len(v) == len(SAVED_STEPS) for v in dict_activation_inputs.values())


def test_seed002_gradient_rules(notebook_trial, caplog):
    trial, expected, params = notebook_trial
    with caplog.at_level(logging.WARNING, logger="mltrace.rules"):
        layer = _run_as_the_notebook(GradientsLayer(trial))
        across = _run_as_the_notebook(GradientsAcrossLayers(trial))
    assert "Can not fetch tensor" not in caplog.text
    assert sorted(layer.tensors) == sorted(f"gradient/{p}" for p in params)
    dict_gradients = {}
    dict_gradients['gradient/conv0_weight_bad_hyperparameters'] = layer.tensors['gradient/conv0_weight']
    dict_gradients['gradient/conv1_weight_bad_hyperparameters'] = layer.tensors['gradient/conv1_weight']
    for step in SAVED_STEPS:
        np.testing.assert_array_equal(dict_gradients['gradient/conv0_weight_bad_hyperparameters'][step],
                                      expected[("TRAIN", step)]["gradient/conv0_weight"])
    assert list(across.tensors) == SAVED_STEPS
    for step in across.tensors:
        print("Step", step, "variance of gradients: ", across.tensors[step][0], " to ",  across.tensors[step][1])
        variances = [np.var(expected[("TRAIN", step)][f"gradient/{p}"].flatten()) for p in params]
        assert across.tensors[step][0] == pytest.approx(min(variances), rel=1e-6)
        assert 0 < across.tensors[step][1] <= max(variances) * (1 + 1e-6)


def test_seed002_weight_input_output_rules(notebook_trial, caplog):
    trial, expected, params = notebook_trial
    with caplog.at_level(logging.WARNING, logger="mltrace.rules"):
        weights = _run_as_the_notebook(WeightRatio(trial))
        inputs = _run_as_the_notebook(Inputs(trial))
        outputs = _run_as_the_notebook(Outputs(trial))
    assert "Can not fetch tensor" not in caplog.text
    assert sorted(weights.tensors) == ["conv0_weight", "conv1_weight", "dense0_weight"]
    loss = "softmaxcrossentropyloss0"
    want_inputs = [f"{b}_input_0" for b in BLOCKS] + [f"{loss}_input_0", f"{loss}_input_1"]
    assert sorted(inputs.tensors) == sorted(want_inputs)
    assert sorted(outputs.tensors) == sorted([f"{b}_output_0" for b in BLOCKS] + [f"{loss}_output_0"])
    for step in SAVED_STEPS:
        want = expected[("TRAIN", step)]
        np.testing.assert_array_equal(weights.tensors["conv0_weight"][step], want["conv0_weight"])
        np.testing.assert_array_equal(outputs.tensors[f"{loss}_output_0"][step],
                                      want[f"{loss}_output_0"])
        assert all(len(per_step) == len(SAVED_STEPS) for per_step in inputs.tensors.values())


def test_seed002_my_custom_rule(notebook_trial, tmp_path):
    healthy = _run_as_the_notebook(MyCustomRule(notebook_trial[0]))
    assert healthy.fired_steps == []
    _train(tmp_path / "dead", tmp_path, dead_relu=True)
    dead = _run_as_the_notebook(MyCustomRule(create_trial(str(tmp_path / "dead"))))
    assert dead.fired_steps == SAVED_STEPS
