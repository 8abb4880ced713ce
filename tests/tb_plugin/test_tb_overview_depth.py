"""The overview at any depth, on trials the PyTorch hook wrote: rows in model order (the order the
model ran its layers, not the names' text order: ``Sequential_2`` before ``Sequential_10``),
grouped by layer, in one section per kind of tensor (weights and gradients never on one colour
scale), and normalizations that show change (per row, relative to the first step, step to
step). The grid's layout and colour scales (tb_plugin/static/overview_rows.js and
overview_scale.js) are tested with node's runner (tests/tb_plugin/js/overview_*.test.mjs). The
browser: test_tb_overview_depth_browser.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard import errors
from tensorboard.plugins import base_plugin
from torch import nn

import mltrace.pytorch as smd
from mltrace.analysis import StatisticCache, StepValues, bucket_rows, tensor_heatmap
from mltrace.analysis.layers import kind_of, layer_of
from mltrace.analysis.normalize import normalize_values
from mltrace.analysis.order import model_order, module_of, natural_key, natural_sorted
from mltrace.trials import create_trial
from mltrace_tb.plugin import MltracePlugin

ROOT = Path(__file__).resolve().parents[2]
#: Linear layers of the MLP (100 Linear+ReLU pairs and the output layer): 202 parameters.
LINEAR = 101
WIDTH = 32
STEPS = 20


def make_mlp_trial(path, steps: int = STEPS, loss_scale: float = 1.0, seed: int = 0,
                   bump: tuple[int, int] | None = None) -> str:
    """A 100-layer ``nn.Sequential`` MLP (Linear+ReLU pairs, then a last Linear) trained ``steps``
    SGD steps with the hook saving weights, biases, gradients (l2 and abs_max only, as on a large
    model) and the loss at every step. He initialisation a little under its gain makes the
    gradients vanish with depth, about a tenth every 12 layers: the pattern the overview must
    show as a gradient from the output to the input, not as stripes. ``loss_scale`` multiplies
    the loss that is back-propagated: a second run whose gradients at step 0 are exactly that
    much larger (the same weights, the same batch). ``bump=(layer, step)`` multiplies the
    weights of Linear layer ``layer`` (0: the input's) by 1.5 just before step ``step``: a run
    that is the same as the plain one until then, and differs first in that layer's weight."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(LINEAR - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
    with torch.no_grad():
        for module in model:
            if isinstance(module, nn.Linear):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                module.weight.mul_(0.9)
                module.bias.fill_(0.01)
    out = str(path)
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(norms=["l2"], abs_reductions=["max"])
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        x, y = torch.randn(64, WIDTH, generator=gen), torch.randn(64, 1, generator=gen)
        if bump is not None and step == bump[1]:
            with torch.no_grad():
                model[2 * bump[0]].weight.mul_(1.5)
        opt.zero_grad()
        (loss_scale * loss_fn(model(x), y)).backward()
        opt.step()
    hook.close()
    return out


def make_gpt2_trial(path, steps: int = 3) -> str:
    """A GPT-2-style model (Transformers' GPT2LMHeadModel from a config: 12 blocks, width 32)
    trained ``steps`` AdamW steps with the hook saving the gradients at every step: 148
    gradients, GPT-2 small's count, named ``gradient/GPT2LMHeadModel_transformer.h.N...``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=32, n_head=2, n_positions=16,
                                       vocab_size=64, bos_token_id=0, eos_token_id=0))
    out = str(path)
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients"])
    hook.register_module(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 64, (4, 16), generator=gen)
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
    hook.close()
    return out


class Net(nn.Module):
    """Registered in one order, run in another, named in a third: ``decoder`` is registered
    first and runs last, ``encoder`` is registered last and runs first, the 12 blocks between
    (``h.0`` .. ``h.11``) sort as text with ``h.10`` before ``h.2``."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = nn.Linear(4, 4)
        self.h = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)) for _ in range(12)])
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder(x)
        for block in self.h:
            x = torch.relu(block(x))
        return self.decoder(x)


def make_net_trial(path, steps: int = 3) -> str:
    torch.manual_seed(0)
    model = Net()
    out = str(path)
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model(torch.randn(8, 4)), torch.randn(8, 4)).backward()
        opt.step()
    hook.close()
    return out


def _mlp_order(prefix: str, params=("bias", "weight")) -> list[str]:
    return [f"{prefix}Sequential_{2 * k}.{p}" for k in range(LINEAR) for p in params]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("depth")
    make_mlp_trial(root / "mlp")
    make_net_trial(root / "net")
    return root


@pytest.fixture(scope="module")
def plugin(root):
    return MltracePlugin(base_plugin.TBContext(), mltrace_logdirs=[str(root)])


def test_natural_key_compares_numbers_as_numbers():
    text = ["Sequential_0", "Sequential_10", "Sequential_100", "Sequential_102", "Sequential_2"]
    assert natural_sorted(text) == ["Sequential_0", "Sequential_2", "Sequential_10", "Sequential_100", "Sequential_102"]
    assert natural_sorted(["h.10.mlp", "H.9.mlp", "h.9.attn", "h.1.mlp"]) == ["h.1.mlp", "h.9.attn", "H.9.mlp", "h.10.mlp"]
    assert natural_key("a2b") < natural_key("a10") and natural_key("x") < natural_key("x0")
    assert sorted(["a", "A"], key=natural_key) == ["A", "a"]  # a tie in folded case: the name decides


def test_a_100_layer_mlp_in_model_order(root):
    """The user's case: 202 gradients of a 100-layer MLP sort as text as Sequential_0, _10, _100,
    _102, ...; in model order they go from the input to the output."""
    trial = create_trial(str(root / "mlp"))
    grads = trial.tensor_names(collection="gradients")
    assert len(grads) == 2 * LINEAR and grads[:4] == ["gradient/Sequential_0.bias", "gradient/Sequential_0.weight",
                                                      "gradient/Sequential_10.bias", "gradient/Sequential_10.weight"]
    ordered = model_order(trial, grads)
    assert ordered == _mlp_order("gradient/")
    assert ordered.index("gradient/Sequential_2.weight") < ordered.index("gradient/Sequential_10.weight")
    assert model_order(trial, trial.tensor_names(collection="weights")) == _mlp_order("", ("weight",))
    # any subset, in any order given, each name once
    assert model_order(trial, ["gradient/Sequential_100.weight", "gradient/Sequential_20.weight",
                               "gradient/Sequential_100.weight"]) == ["gradient/Sequential_20.weight",
                                                                      "gradient/Sequential_100.weight"]


def test_model_order_is_the_order_the_model_ran_not_registered_nor_named(root):
    """``decoder`` is registered first, ``encoder`` last; the encoder runs first. The gradients'
    records (the backward pass, reversed) give the order of execution for gradients and
    weights; a name the trial does not have comes last."""
    trial = create_trial(str(root / "net"))
    written = [n for n in trial.tensor_names(collection="weights")]
    blocks = [f"Net_h.{k}.{j}.weight" for k in range(12) for j in (0, 1)]
    assert model_order(trial, written) == ["Net_encoder.weight", *blocks, "Net_decoder.weight"]
    assert natural_sorted(written)[0] == "Net_decoder.weight"  # what text order would show first
    grads = model_order(trial, trial.tensor_names(collection="gradients"))
    assert grads[:2] == ["gradient/Net_encoder.bias", "gradient/Net_encoder.weight"]
    assert grads[-2:] == ["gradient/Net_decoder.bias", "gradient/Net_decoder.weight"]
    assert [module_of(n) for n in grads[2:-2:4]] == [f"Net_h.{k}.0" for k in range(12)]
    assert model_order(trial, ["zz_unknown", "Net_decoder.weight", "aa_unknown"]) == [
        "Net_decoder.weight", "aa_unknown", "zz_unknown"]
    everything = model_order(trial, trial.tensor_names())
    assert everything.index("MSELoss_output_0") > everything.index("Net_decoder.weight")  # the loss last


def test_layers_group_rows_by_block(root):
    trial = create_trial(str(root / "net"))
    groups = [layer_of(n) for n in model_order(trial, trial.tensor_names(collection="gradients"))]
    assert list(dict.fromkeys(groups)) == ["gradient/Net_encoder", *[f"gradient/Net_h.{k}" for k in range(12)],
                                           "gradient/Net_decoder"]
    assert groups.count("gradient/Net_h.3") == 4  # the block's Linear and LayerNorm, weight and bias
    for name, layer in (("gradient/GPT2LMHeadModel_transformer.h.0.attn.c_attn.weight", "gradient/GPT2LMHeadModel_transformer.h.0"),
                        ("GPT2LMHeadModel_transformer.ln_f.bias", "GPT2LMHeadModel_transformer.ln_f"),
                        ("Net_layers.12.mlp.fc1.weight", "Net_layers.12"), ("Sequential_3_output_0", "Sequential_3"),
                        ("Sequential_10.weight", "Sequential_10"), ("MSELoss_output_0", "MSELoss"),
                        ("dense_1/kernel:0", "dense_1"), ("Net_fc1.weight", "Net_fc1"), ("loss", "loss")):
        assert layer_of(name) == layer and name.startswith(layer), name
    assert kind_of("gradient/a", ["all", "default"]) == "gradients"
    assert kind_of("Net_fc1.bias", ["all", "biases", "default"]) == "biases"
    assert kind_of("x", ["all", "mine"]) == "mine" and kind_of("x", ["default"]) == "other"


def test_the_overview_sends_rows_in_model_order_with_their_layers(plugin):
    answer = plugin.overview_impl("mlp", columns=2000)
    rows = answer["rows"]
    assert [r["tensor"] for r in rows] == _mlp_order("gradient/")
    assert [r["group"] for r in rows[:4]] == ["gradient/Sequential_0"] * 2 + ["gradient/Sequential_2"] * 2
    assert {r["kind"] for r in rows} == {"gradients"} and answer["kinds"] == ["gradients"]
    assert answer["normalize"] == "none" and answer["normalizations"] == ["none", "row", "first", "change"]
    # the filter keeps the order
    only = plugin.overview_impl("mlp", pattern=r"Sequential_(2|10|100)\.weight")
    assert [r["tensor"] for r in only["rows"]] == [f"gradient/Sequential_{k}.weight" for k in (2, 10, 100)]


def test_all_tensors_come_in_sections_of_one_kind(plugin):
    """In "(all tensors)" weights, biases, gradients and the loss are sections of their own (one
    colour scale each in the tab), each in model order."""
    answer = plugin.overview_impl("mlp", collection="*", columns=10)
    kinds = [r["kind"] for r in answer["rows"]]
    assert answer["kinds"] == ["gradients", "weights", "biases", "losses"]
    assert kinds == sorted(kinds, key=answer["kinds"].index)  # each section in one piece
    by_kind = {k: [r["tensor"] for r in answer["rows"] if r["kind"] == k] for k in answer["kinds"]}
    assert by_kind["gradients"] == _mlp_order("gradient/")
    assert by_kind["weights"] == _mlp_order("", ("weight",)) and by_kind["biases"] == _mlp_order("", ("bias",))
    assert by_kind["losses"] == ["MSELoss_output_0"]
    assert not any(t.startswith("gradient/") for t in by_kind["weights"] + by_kind["biases"])
    # one collection is one kind, whatever its tensors' other collections
    assert {r["kind"] for r in plugin.overview_impl("mlp", collection="weights")["rows"]} == {"weights"}


def _table(answer) -> dict[str, np.ndarray]:
    return {r["tensor"]: np.array([np.nan if v is None else v for v in r["high"]]) for r in answer["rows"]}


def test_normalizations_make_change_visible(plugin):
    """Per row (1 at each row's largest), relative to step 0 (1 there), step to step (the ratio
    of consecutive steps), against the values as saved; unknown ones are refused."""
    raw = _table(plugin.overview_impl("mlp", columns=2000))
    row = _table(plugin.overview_impl("mlp", columns=2000, normalize="row"))
    first = _table(plugin.overview_impl("mlp", columns=2000, normalize="first"))
    change = _table(plugin.overview_impl("mlp", columns=2000, normalize="change"))
    deep, shallow = "gradient/Sequential_0.weight", "gradient/Sequential_200.weight"
    assert raw[deep].shape == (STEPS,)
    for name, values in raw.items():
        assert row[name].max() == pytest.approx(1.0, rel=1e-4)
        assert row[name] == pytest.approx(values / values.max(), rel=1e-3)
        assert first[name][0] == 1.0 and first[name] == pytest.approx(values / values[0], rel=1e-3)
        assert np.isnan(change[name][0])  # no step before the first
        assert change[name][1:] == pytest.approx(values[1:] / values[:-1], rel=1e-3)
    # the sizes differ by decades between layers; each normalized row starts at 1 all the same
    assert raw[deep][0] / raw[shallow][0] > 10 or raw[shallow][0] / raw[deep][0] > 10
    with pytest.raises(errors.InvalidArgumentError, match="none, row, first, change"):
        plugin.overview_impl("mlp", normalize="zscore")


def test_a_normalization_never_makes_or_hides_a_nan():
    """Zeros, NaN and infinities: a ratio with no meaning is left out (never counted as a NaN of
    the tensor); the tensor's own NaN and infinities are counted as saved."""
    values = np.array([0.0, 0.0, 2.0, np.nan, 4.0, np.inf, 8.0, 0.0])
    first = normalize_values(values, "first")  # over the first positive value, 2; zeros stay zeros
    assert first[[0, 1, 2, 4, 6, 7]].tolist() == [0.0, 0.0, 1.0, 2.0, 4.0, 0.0] and np.isnan(first[[3, 5]]).all()
    changed = normalize_values(values, "change")
    assert changed[1] == 1.0 and np.isnan(changed[[0, 2, 3, 4, 5, 6]]).all() and changed[7] == 0.0
    assert normalize_values(values, "row")[[2, 6]].tolist() == [0.25, 1.0]
    assert normalize_values(np.zeros(3), "row").tolist() == [0.0, 0.0, 0.0]
    steps = np.arange(len(values))
    for how in ("none", "row", "first", "change"):
        out = bucket_rows([("t", StepValues(steps, values))], "l2", 100, how).rows[0]
        assert out.nan.tolist() == [0, 0, 0, 1, 0, 0, 0, 0] and out.posinf.tolist() == [0, 0, 0, 0, 0, 1, 0, 0]
        assert out.count.tolist() == [1] * 8
    with pytest.raises(ValueError, match="normalize='z'"):
        normalize_values(values, "z")


def test_layout_and_scales_with_node_test_runner():
    """overview_rows.js (natural order, prefix, sections, groups) and overview_scale.js (one
    scale per kind shared by runs, ratios on a diverging scale) with node's own runner."""
    node = shutil.which("node")
    assert node, "node (20 or later) is needed for the frontend's unit tests: apt-get install nodejs"
    files = sorted(str(p) for p in (ROOT / "tests" / "tb_plugin" / "js").glob("overview_*.test.mjs"))
    assert len(files) == 2
    done = subprocess.run([node, "--test", *files], capture_output=True, text=True, cwd=ROOT, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "# fail 0" in out and "# pass 0" not in out, out[-2000:]


def test_switching_the_statistic_of_raw_tensors_reads_nothing_again(root, monkeypatch):
    """The weights are saved raw: the l2 overview decodes each value once, and the other
    statistics of the overview come from the same decode, so switching to them reads no record
    (and gives what a fresh read gives)."""
    trial = create_trial(str(root / "mlp"))
    names = trial.tensor_names(collection="weights")
    cache = StatisticCache()
    tensor_heatmap(trial, names, "l2", cache=cache)
    reads: list[tuple] = []
    for method in ("read", "read_many"):
        real = getattr(trial.storage, method)
        monkeypatch.setattr(trial.storage, method,
                            lambda *a, _real=real, **k: reads.append(a) or _real(*a, **k))
    for statistic in ("abs_max", "nan_count", "zero_fraction"):
        switched = tensor_heatmap(trial, names, statistic, cache=cache)
        fresh = tensor_heatmap(create_trial(str(root / "mlp")), names, statistic)
        assert [r.tensor for r in switched.rows] == [r.tensor for r in fresh.rows]
        for a, b in zip(switched.rows, fresh.rows):
            np.testing.assert_array_equal(a.high, b.high)
            np.testing.assert_array_equal(a.count, b.count)
    assert reads == []
