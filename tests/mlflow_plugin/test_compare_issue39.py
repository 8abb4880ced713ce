"""``mltrace compare`` on many layers, against a real MLflow server: tensors in natural order,
"1 run" / "N runs", PNG pages and a cap on tensors with a note of what was left out, and for two
runs where they part ways (made to differ at a known layer from a known step)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from mlflow import MlflowClient
from PIL import Image
from torch import nn

import mltrace.pytorch as smd
from mltrace import cli
from mltrace_mlflow import series_plots
from mltrace_mlflow.compare import compare_runs

LAYERS = 12  # Sequential_0 ... Sequential_11: as text, _10 and _11 sort before _2
NAMES = [f"Sequential_{i}.weight" for i in range(LAYERS)]


def _train(out_dir, experiment, run_name, steps=12, perturb=None):
    """12 linear layers near the identity, weights saved every step; ``perturb=(layer, step)``
    scales that layer's weight by 1.5 just before that step's forward pass."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(LAYERS)])
    with torch.no_grad():
        for layer in model:
            layer.weight.copy_(torch.eye(4) + 0.01 * torch.randn(4, 4))
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "losses"],
                    mlflow={"experiment": experiment, "run_name": run_name})
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        if perturb is not None and step == perturb[1]:
            with torch.no_grad():
                model[perturb[0]].weight.mul_(1.5)
        x = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        loss_fn(model(x), x).backward()
        opt.step()
    hook.close()


@pytest.fixture
def figures(monkeypatch):
    """Every figure compare draws (its pages), in order."""
    drawn = []
    original = series_plots.series_figure

    def keep(*args, **kwargs):
        drawn.append(original(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(series_plots, "series_figure", keep)
    return drawn


def _panel_titles(fig):
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def test_tensors_in_natural_order_and_one_run_is_1_run(server, tmp_path, figures, capsys):
    _train(tmp_path / "a", "layers-1", "a")
    result = compare_runs(["layers-1"], tensors=["Sequential_"], out_dir=str(tmp_path / "out"))
    assert result.tensors == NAMES
    assert list(result.series) == [f"{name} · mean" for name in NAMES]
    assert [c for c in result.columns if c.endswith("(last)")] == [f"{n} mean (last)" for n in NAMES]
    assert result.title == "1 run"
    assert [fig._suptitle.get_text() for fig in figures] == ["1 run"]  # 12 panels: one page
    assert _panel_titles(figures[0]) == [f"{name} · mean" for name in NAMES]
    assert result.plot_paths == [str(tmp_path / "out" / "comparison.png")]

    assert cli.main(["compare", "layers-1", "--tensor", "Sequential_", "--out",
                     str(tmp_path / "cli"), "--no-log"]) == 0
    legend = re.findall(r"\[(\d+)\] (Sequential_\d+)\.weight", capsys.readouterr().out)
    assert [name for _, name in legend] == [n.removesuffix(".weight") for n in NAMES]


def test_many_tensors_are_paged_and_capped_with_a_note(server, tmp_path, figures):
    _train(tmp_path / "a", "layers-2", "a")
    _train(tmp_path / "b", "layers-2", "b")
    out = tmp_path / "out"
    result = compare_runs(["layers-2"], tensors=["Sequential_"], stats=["mean", "l2"],
                          max_tensors=10, out_dir=str(out))
    assert result.tensors == NAMES[:10] and result.left_out == NAMES[10:]
    assert result.title == "2 runs"
    assert [fig._suptitle.get_text() for fig in figures[:2]] == [
        "2 runs · page 1 of 2 (panels 1–12 of 20)", "2 runs · page 2 of 2 (panels 13–20 of 20)"]
    assert result.plot_paths == [str(out / "comparison-1.png"), str(out / "comparison-2.png")]
    assert not (out / "comparison.png").exists()
    for path in result.plot_paths:
        with Image.open(path) as image:
            assert image.width == 1600 and image.height <= 3000  # not 1600 x 4,000+ in one image
    text = result.to_text()
    assert "compared the first 10 of 12 tensors" in text and "left out 2" in text
    assert "Sequential_10.weight" in text and "Sequential_11.weight" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    with open(out / "comparison.json") as f:
        assert json.load(f)["left_out_tensors"] == NAMES[10:]
    logged = {a.path for a in MlflowClient().list_artifacts(result.mlflow_run_id, "comparison")}
    assert {"comparison/comparison-1.png", "comparison/comparison-2.png"} <= logged
    assert result.difference_paths == []  # the two runs agree: no ratio differs from 1


@pytest.mark.parametrize("max_steps", [500, 4])  # 4: the thinned series skip the step itself
def test_two_runs_part_ways_at_the_layer_and_step_made_to_differ(server, tmp_path, figures,
                                                                 max_steps):
    experiment = f"parting-{max_steps}"  # the server outlives the test: one experiment each
    _train(tmp_path / "a", experiment, "clean")
    _train(tmp_path / "b", experiment, "layer 7 x1.5 at step 6", perturb=(7, 6))
    result = compare_runs([experiment], tensors=["Sequential_"], max_steps=max_steps,
                          out_dir=str(tmp_path / "out"), log_to_mlflow=False)
    parting = result.parting
    assert parting is not None
    assert (parting.step, parting.tensor, parting.statistic) == (6, "Sequential_7.weight", "mean")
    assert parting.ratio == pytest.approx(1.5, rel=1e-5) and parting.others == []
    assert "runs 1 and 2 part ways at step 6: Sequential_7.weight mean is 1.5 x" in result.to_text()
    ratios = result.difference["Sequential_7.weight · mean"]
    steps, values = next(iter(ratios.values()))
    assert all(v == 1.0 for s, v in zip(steps, values) if s < 6)
    assert [v for s, v in zip(steps, values) if s == 6] in ([], [pytest.approx(1.5, rel=1e-5)])
    assert len(result.difference_paths) == 1

    assert len(_panel_titles(figures[0])) == LAYERS  # the comparison page, then the ratio page
    assert "► parts ways here: Sequential_7.weight · mean" in _panel_titles(figures[1])
    for fig in figures:  # the comparison page and the ratio page mark the step and the tensor
        panels = [ax for ax in fig.axes if ax.get_visible()]
        for ax in panels:
            marks = [line for line in ax.get_lines() if line.get_gid() == series_plots.MARK_GID]
            assert [list(line.get_xdata()) for line in marks] == [[6, 6]]
        flagged = [ax for ax in panels if ax.get_title().startswith("► parts ways here")]
        assert [ax.get_title() for ax in flagged] == ["► parts ways here: Sequential_7.weight · mean"]
        assert flagged[0].title.get_color() == series_plots.MARK_COLOR
    assert len(figures) == 2


def test_two_runs_that_agree_do_not_part_ways(server, tmp_path, figures):
    _train(tmp_path / "a", "agree", "a", steps=6)
    _train(tmp_path / "b", "agree", "b", steps=6)
    result = compare_runs(["agree"], tensors=["Sequential_"], out_dir=str(tmp_path / "out"),
                          log_to_mlflow=False)
    assert result.parting is None
    assert "runs 1 and 2 agree at every step both saved" in result.to_text()
    assert all(values == [1.0] * 6 for lines in result.difference.values()
               for _, values in lines.values())
    assert not any(line.get_gid() == series_plots.MARK_GID
                   for fig in figures for ax in fig.axes for line in ax.get_lines())
    assert len(figures) == 1 and result.difference_paths == []  # no ratio page: nothing differs
