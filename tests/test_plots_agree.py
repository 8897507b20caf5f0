"""`dvc plots show` and the report's figure draw the same picture: real DVC renders the committed plot data
(reports/plots/p_at_1_vs_noise.csv, through dvc.yaml's plot definition and its template), matplotlib draws the
report's figure from the committed results (reports/results.csv); the points, their labels (the papers' names),
units (%), rows and noise kinds, and which runs are lines must agree."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from noisydml.config import load_params
from noisydml.reporting import figures, main_table
from noisydml.reporting.tables import plot_series

ROOT = Path(__file__).resolve().parents[1]
DATA = "reports/plots/p_at_1_vs_noise.csv"


def _dvc_rendering(tmp_path: Path) -> dict:
    """`dvc plots show --json` of the committed plot data, in a scratch DVC repository holding dvc.yaml's own
    definition of that plot (the report stage's), its template and the data."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    definition = next(entry[DATA] for entry in stages["report"]["plots"] if DATA in entry)
    definition = {k: v for k, v in definition.items() if k != "cache"}
    for path in (DATA, definition["template"]):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"plots": [{DATA: definition}]}))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    shown = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "--json"], cwd=tmp_path, check=True,
                           capture_output=True, text=True)
    (rendering,) = json.loads(shown.stdout)["data"][DATA]
    return rendering["content"]


def _figure_points(monkeypatch) -> tuple[dict, set, list[str]]:
    """The report's figure drawn from the committed results: every point (figure row, noise kind, label, rate %,
    P@1 %), the labels drawn as lines, and the y axis's title."""
    params = load_params(ROOT / "params.yaml")
    summary = pd.read_csv(ROOT / "reports/results.csv")
    shown = plot_series(summary)
    shown = shown[~shown["method"].isin(main_table.reference_rows(params))]
    drawn = figures.noise_points(shown, "precision_at_1", params["report"]["panels"], params["report"]["labels"])
    saved = []
    monkeypatch.setattr(figures, "_save", lambda fig, path, vector=False: saved.append(fig))
    figures.plot_metric_vs_noise(drawn, "precision_at_1", Path("unused.png"), "P@1")
    (fig,) = saved
    points, lines, y_titles = {}, set(), []
    for ax in fig.axes:
        if not ax.get_title():
            continue
        row, _, kind = ax.get_title().partition(": ")
        kind = kind.removesuffix(" noise") or "none"
        rates = {round(tick): float(label.get_text().rstrip("%")) for tick, label in
                 zip(ax.get_xticks(), ax.get_xticklabels())}
        y_titles.append(ax.get_ylabel())
        for container in ax.containers:  # one errorbar per run
            line = container.lines[0]
            label = container.get_label()
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                points[row, kind, label, rates[round(x)]] = float(y)
            if line.get_linestyle() != "None":
                lines.add((row, kind, label))
    return points, lines, [t for t in y_titles if t]


def test_dvc_plots_show_draws_what_the_report_figure_draws(tmp_path, monkeypatch):
    content = _dvc_rendering(tmp_path)
    values = content["data"]["values"]
    dvc_points = {(v["row"], v["noise_kind"], v["method"], float(v["noise_rate"])): float(v["precision_at_1"])
                  for v in values}
    dvc_lines = {(v["row"], v["noise_kind"], v["method"]) for v in values if str(v["joined"]) == "1"}
    fig_points, fig_lines, y_titles = _figure_points(monkeypatch)
    assert len(dvc_points) == len(values) and dvc_points.keys() == fig_points.keys()
    assert all(dvc_points[k] == pytest.approx(fig_points[k], abs=1e-3) for k in dvc_points)  # the CSV's 4 digits
    assert dvc_lines == fig_lines
    # units and names: % on both axes, the papers' names (no run id where a label exists), no reference row
    labels = load_params(ROOT / "params.yaml")["report"]["labels"]
    spec = json.dumps(content)
    assert "P@1 (%)" in spec and set(y_titles) == {"P@1 (%)"}
    assert {v["method"] for v in values} <= set(labels.values()) | {v["run"] for v in values if v["run"] not in labels}
    assert not any(v["run"] == "spa_confidence" for v in values)
    assert max(float(v["precision_at_1"]) for v in values) > 1  # %, not fractions
    # the x axis is categorical (no offset is read as a rate) and lines are drawn only for `joined` runs
    layers = content["spec"]["layer"]
    assert content["spec"]["encoding"]["x"]["type"] == "ordinal"
    assert any(layer["mark"]["type"] == "line" and "joined" in json.dumps(layer.get("transform")) for layer in layers)


@pytest.mark.parametrize("rates", [[0.0, 0.5], [0.0, 0.2, 0.5]])
def test_lines_only_through_three_or_more_rates_on_a_categorical_axis(monkeypatch, rates):
    summary = pd.DataFrame([{"dataset": "glyphs", "noise": f"sym{int(100 * r)}" if r else "clean",
                             "noise_kind": "symmetric" if r else "none", "noise_rate": r, "method": m, "seeds": 1,
                             "precision_at_1": 0.6 - r / 2 - (m == "ms") / 10, "precision_at_1_std": float("nan")}
                            for r in rates for m in ("ms", "prism")])
    drawn = figures.noise_points(plot_series(summary), "precision_at_1", {}, {"prism": "PRISM"})
    assert set(drawn["joined"]) == {int(len(rates) >= figures.LINE_FROM)}
    assert set(drawn["method"]) == {"ms", "PRISM"} and drawn["precision_at_1"].max() == pytest.approx(60.0)
    saved = []
    monkeypatch.setattr(figures, "_save", lambda fig, path, vector=False: saved.append(fig))
    figures.plot_metric_vs_noise(drawn, "precision_at_1", Path("unused.png"), "P@1")
    ax = saved[0].axes[0]
    xs = [x for c in ax.containers for x in c.lines[0].get_xdata()]
    # every point within half a category of its setting's place: none reads as another rate
    assert all(abs(x - round(x)) < 0.5 for x in xs) and ax.get_xlim() == (-0.5, len(rates) - 0.5)


def test_every_panel_of_the_figure_shares_one_y_scale(monkeypatch):
    # a method and its baseline in different rows (BSPML among the noise-robust methods, MS at rho 1 among the
    # baselines) are read on the same scale
    summary = pd.DataFrame([{"dataset": "glyphs", "noise": n, "noise_kind": "symmetric" if r else "none",
                             "noise_rate": r, "method": m, "seeds": 1, "precision_at_1": v - r / 2,
                             "precision_at_1_std": float("nan")}
                            for n, r in (("clean", 0.0), ("sym50", 0.5)) for m, v in (("ms_rho1", 0.9), ("bspml", 0.3))])
    drawn = figures.noise_points(plot_series(summary), "precision_at_1", {"a": ["ms_rho1"], "b": ["bspml"]}, {})
    saved = []
    monkeypatch.setattr(figures, "_save", lambda fig, path, vector=False: saved.append(fig))
    figures.plot_metric_vs_noise(drawn, "precision_at_1", Path("unused.png"), "P@1")
    limits = {ax.get_ylim() for ax in saved[0].axes if ax.get_title()}
    assert len(limits) == 1 and len([ax for ax in saved[0].axes if ax.get_title()]) == 2
