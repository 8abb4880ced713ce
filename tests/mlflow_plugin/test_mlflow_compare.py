"""Compare training runs across experiments: table, PNG, rule findings, logged as artifacts."""

from __future__ import annotations

import csv

import pytest
from mlflow import MlflowClient
from PIL import Image

from mltrace import cli
from mltrace.exceptions import MltraceValueError
from mltrace.rules import invoke_rule
from mltrace.rules.builtin.vanishing_gradient import VanishingGradient
from mltrace.trials import create_trial
from mltrace_mlflow.compare import compare_runs
from tests.support.mlflow_env import train

LOSS = "MSELoss_output_0"


@pytest.fixture
def two_experiments(tracking, tmp_path):
    """baseline: lr 0.05 (a rule fired); sweep: lr 0.01 and lr 0.2; plus a run without a trial."""
    runs = {}
    for exp, lr in (("baseline", 0.05), ("sweep", 0.01), ("sweep", 0.2)):
        hook, _ = train(tmp_path / f"{exp}-{lr}", steps=6, mlflow={"experiment": exp, "run_name": f"lr={lr}",
                                                                   "tags": {"lr": str(lr)}})
        runs[lr] = hook.sinks[0].run_id
    invoke_rule(VanishingGradient(create_trial(str(tmp_path / "baseline-0.05")), threshold=1.0), end_step=6)
    MlflowClient().create_run(MlflowClient().get_experiment_by_name("sweep").experiment_id)  # not mltrace's
    return runs


def test_compare_across_experiments(two_experiments, tmp_path):
    result = compare_runs(["baseline", "sweep"], tensors=[LOSS, "Sequential_0.weight"], stats=["mean", "l2"],
                          out_dir=str(tmp_path / "out"))
    assert [r["run_id"] for r in result.rows] == [two_experiments[lr] for lr in (0.05, 0.01, 0.2)]  # no rule runs
    assert [r["run"] for r in result.rows] == ["baseline/lr=0.05", "sweep/lr=0.01", "sweep/lr=0.2"]
    first = result.rows[0]
    trial = create_trial(str(tmp_path / "baseline-0.05"))
    assert first[f"{LOSS} mean (last)"] == pytest.approx(float(trial.tensor(LOSS).value(5)))
    assert first["Sequential_0.weight l2 (last)"] == pytest.approx(
        float(trial.tensor("Sequential_0.weight").reduction_value(5, "l2")), rel=1e-6)
    assert first["rules"] == "VanishingGradient: IssuesFound @0" and result.rows[1]["rules"] is None
    assert set(result.series) == {f"{LOSS} · mean", f"{LOSS} · l2", "Sequential_0.weight · mean",
                                  "Sequential_0.weight · l2"}
    steps, values = result.series[f"{LOSS} · mean"]["sweep/lr=0.2"]
    assert steps == list(range(6)) and len(values) == 6

    with Image.open(result.plot_path) as image:
        assert image.format == "PNG"
    with open(result.table_path) as f:
        assert [row["run"] for row in csv.DictReader(f)] == ["baseline/lr=0.05", "sweep/lr=0.01", "sweep/lr=0.2"]
    assert "baseline/lr=0.05" in result.to_text() and len(result.to_dataframe()) == 3
    with Image.open(result.plot_path) as image:
        assert image.width >= 1200

    client = MlflowClient()
    logged = client.get_run(result.mlflow_run_id)
    assert client.get_experiment(logged.info.experiment_id).name == "mltrace-comparisons"
    assert logged.data.tags["mltrace.run_type"] == "comparison"
    assert {a.path for a in client.list_artifacts(result.mlflow_run_id, "comparison")} == {
        "comparison/comparison.csv", "comparison/comparison.json", "comparison/comparison.png"}


def test_compare_with_a_filter_string(two_experiments, tmp_path):
    result = compare_runs(filter_string="tags.lr = '0.2'", out_dir=str(tmp_path / "out"), log_to_mlflow=False)
    assert [r["run_id"] for r in result.rows] == [two_experiments[0.2]]
    assert f"{LOSS} mean (last)" in result.rows[0]  # default tensors: the losses collection
    assert result.mlflow_run_id is None


def test_mltrace_compare_command(two_experiments, tmp_path, capsys):
    code = cli.main(["compare", "baseline", "sweep", "--stat", "abs_max", "--out", str(tmp_path / "cli"), "--no-log"])
    out = capsys.readouterr().out
    assert code == 0
    assert "sweep/lr=0.01" in out and "VanishingGradient@0" in out
    assert f"[1] {LOSS} abs_max" in out  # the legend of a column headed by its number
    table = out.split("every column in full")[0]
    assert max(len(line) for line in table.splitlines()) <= 100
    assert str(tmp_path / "cli" / "comparison.csv") in out
    assert (tmp_path / "cli" / "comparison.png").exists()
    assert cli.main(["compare", "no-such-experiment", "--no-log"]) == 2
    assert "no MLflow experiment named 'no-such-experiment'" in capsys.readouterr().err
    with pytest.raises(MltraceValueError, match="no mltrace training run"):
        compare_runs(["Default"], log_to_mlflow=False)


def test_table_fits_100_columns_and_the_csv_keeps_everything(two_experiments, tmp_path):
    result = compare_runs(["baseline", "sweep"], tensors=[".*"], stats=["mean", "l2", "abs_max"],
                          out_dir=str(tmp_path / "out"), log_to_mlflow=False)
    values = [c for c in result.columns if c.endswith("(last)")]
    assert len(values) >= 12  # 4+ tensors x 3 statistics: far wider than 100 columns in one line
    text = result.to_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert sum(line.startswith("#") for line in lines) >= 3  # the statistics wrap into blocks
    for i, column in enumerate(values):  # each statistic is in the table, by name or legend
        name = column.removesuffix(" (last)")
        assert name in text.split() or f"[{i + 1}] {name}" in text
    with open(result.table_path) as f:
        header = next(csv.reader(f))
    assert set(values) <= set(header) and "run_id" in header and "trial" in header
    assert "columns:" in text  # the legend of the numbered columns


def test_plot_is_wide_log_scaled_and_its_labels_do_not_overlap(tmp_path):
    from mltrace_mlflow.plots import plot_series, series_figure

    steps = list(range(0, 2000, 10))
    panels = {
        "gradient/Net_conv1.weight · l2": {  # a collapsing run next to a healthy one
            "exp/healthy": (steps, [0.5 + 0.1 * (s % 7) for s in steps]),
            "exp/bad init": (steps, [1e-10 * (1 + s % 3) for s in steps]),
            "exp/collapsed": (steps, [0.0 if s > 1000 else 1e-3 for s in steps])},
        "gradient/" + "very_long_module_name." * 8 + "weight · abs_max": {
            "exp/healthy": (steps, [1.0 + s / 1000 for s in steps])},
        "CrossEntropyLoss_output_0 · mean": {
            "exp/healthy": (steps, [2.0 / (1 + s / 100) for s in steps]),
            "other experiment/lr=10": (steps, [2.0 + s for s in steps])},
    }
    markers = {"exp/bad init": {"VanishingGradient": 10}, "exp/collapsed": {"NaNInfDetected": 1010}}
    fig = series_figure(panels, markers, title="3 runs")
    fig.canvas.draw()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert axes[0].get_yscale() == "symlog"  # zeros beside 1e-10: 1e-10 must not sit on 0
    assert axes[1].get_yscale() == "linear"
    assert axes[2].get_yscale() == "log"
    assert all(ax.get_xlabel() == "global step" and ax.get_ylabel() for ax in axes)
    renderer = fig.canvas.get_renderer()
    boxes = []
    for ax in axes:  # tick labels matplotlib draws: those of ticks inside the axes' limits
        inside = ax.get_window_extent(renderer)
        boxes += [t.get_window_extent(renderer) for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
        for t in ax.get_xticklabels():
            box = t.get_window_extent(renderer)
            if t.get_text() and inside.x0 - 1 <= (box.x0 + box.x1) / 2 <= inside.x1 + 1:
                boxes.append(box)
        for t in ax.get_yticklabels():
            box = t.get_window_extent(renderer)
            if t.get_text() and inside.y0 - 1 <= (box.y0 + box.y1) / 2 <= inside.y1 + 1:
                boxes.append(box)
    boxes += [fig.legends[0].get_window_extent(renderer)]
    for i, a in enumerate(boxes):  # no two labels overlap (beyond a pixel of anti-aliasing)
        for b in boxes[i + 1:]:
            overlap_w = min(a.x1, b.x1) - max(a.x0, b.x0)
            overlap_h = min(a.y1, b.y1) - max(a.y0, b.y0)
            assert overlap_w <= 1 or overlap_h <= 1, (a, b)
    fig_box = fig.bbox
    assert all(b.x0 >= -1 and b.x1 <= fig_box.x1 + 1 for b in boxes)  # nothing cut off
    path = plot_series(panels, str(tmp_path / "p.png"), markers)
    with Image.open(path) as image:
        assert image.width >= 1200


def test_bad_stat_or_tensor_exits_2_listing_valid_values(two_experiments, tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert cli.main(["compare", "--stat", "meen", "--out", out, "--no-log"]) == 2
    err = capsys.readouterr().err
    assert "'meen'" in err and "mean" in err and "abs_max" not in err or "abs_<name>" in err
    assert cli.main(["compare", "--tensor", "no_such_tensor", "--out", out, "--no-log"]) == 2
    err = capsys.readouterr().err
    assert "'no_such_tensor'" in err and LOSS in err and "Sequential_0.weight" in err
    assert cli.main(["compare", "--tensor", "(", "--out", out, "--no-log"]) == 2
    assert "not a valid regular expression" in capsys.readouterr().err


def test_no_tracking_uri_is_an_explicit_error_and_creates_nothing(tmp_path, monkeypatch, capsys):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(None)
    try:
        assert not mlflow.is_tracking_uri_set()
        assert cli.main(["compare", "--no-log"]) == 2
        err = capsys.readouterr().err
        assert "MLFLOW_TRACKING_URI" in err and "--tracking-uri" in err
        missing = tmp_path / "elsewhere" / "mlflow.db"
        assert cli.main(["compare", "--tracking-uri", f"sqlite:///{missing}", "--no-log"]) == 2
        assert str(missing) in capsys.readouterr().err
        assert list(tmp_path.iterdir()) == []  # no ./mlflow.db, no mlruns/
    finally:
        mlflow.set_tracking_uri(None)
