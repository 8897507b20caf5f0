"""The report's tables: per-seed summary (sample standard deviation), the Markdown layout, selection scores."""

import numpy as np
import pandas as pd
import pytest

from noisydml.reporting import main_table
from noisydml.reporting.tables import selection_summary, summarise

KEYS = dict(dataset="glyphs", noise_kind="symmetric", noise_rate=0.5, actual_noise_rate=0.5)


def _per_seed():
    rows = []
    for method, p1 in (("ms", [0.2, 0.3, 0.4]), ("prism", [0.5, 0.6, 0.7])):
        for seed, v in enumerate(p1):
            rows.append({**KEYS, "noise": "sym50", "method": method, "run_kind": "grid", "seed": seed,
                         "precision_at_1": v, "mean_average_precision_at_r": v / 10,
                         "final_diag_selection_precision": 0.8 + seed / 100 if method == "prism" else np.nan,
                         "final_diag_selection_recall": 0.7 if method == "prism" else np.nan,
                         "final_diag_kept_fraction": 0.5 if method == "prism" else np.nan})
    rows.append({**KEYS, "noise": "sym50", "method": "ms_on_prism_kept", "run_kind": "chain", "seed": 0,
                 "precision_at_1": 0.9, "mean_average_precision_at_r": 0.09})
    return pd.DataFrame(rows)


def _params(seeds):
    return {"grid": {"datasets": ["glyphs"], "noises": ["sym50", "clean"], "methods": ["ms", "prism"], "seeds": seeds},
            "chains": {"c": {"name": "ms_on_prism_kept"}}, "evaluate": {"recall_at": [1]},
            "train": {"model_selection": "last", "validation_classes": 0},
            "report": {"metrics": ["precision_at_1", "mean_average_precision_at_r"],
                       "labels": {"ms": "MS", "ms_on_prism_kept": "MS on kept_1 & 50%"}, "panels": {}}}


def test_summary_uses_the_sample_standard_deviation():
    summary = summarise(_per_seed(), ["precision_at_1"]).set_index("method")
    assert summary.loc["ms", "precision_at_1"] == pytest.approx(0.3)
    assert summary.loc["ms", "precision_at_1_std"] == pytest.approx(0.1)  # ddof=1: sqrt(0.02 / 2)
    assert summary.loc["ms", "seeds"] == 3 and np.isnan(summary.loc["ms_on_prism_kept", "precision_at_1_std"])


def test_main_table_rows_columns_cells_and_best_in_bold():
    summary = summarise(_per_seed(), ["precision_at_1", "mean_average_precision_at_r"])
    text = "\n".join(main_table.markdown(summary, _params([0, 1, 2])))
    assert "n = 3 seeds (± sample standard deviation (ddof=1))" in text
    assert "| Method | sym50 P@1 | sym50 MAP@R | clean P@1 | clean MAP@R |" in text
    assert "| MS | 30.0 ± 10.0 | 3.0 ± 1.0 | – | – |" in text
    assert "| prism | 60.0 ± 10.0 | 6.0 ± 1.0 | – | – |" in text  # no label: the run's name
    assert "| MS on kept_1 & 50% | **90.0** | **9.0** | – | – |" in text  # one seed: no ±; best of its column
    assert "MS = `ms`" in text and "prism = " not in text
    assert main_table.row_names(_params([0])) == ["ms", "prism", "ms_on_prism_kept"]


def _balanced(text: str) -> bool:
    depth = 0
    for i, ch in enumerate(text):
        if ch in "{}" and (i == 0 or text[i - 1] != "\\"):
            depth += 1 if ch == "{" else -1
            if depth < 0:
                return False
    return depth == 0


def test_latex_table_is_balanced_escaped_and_one_tabular_per_dataset():
    summary = summarise(_per_seed(), ["precision_at_1", "mean_average_precision_at_r"])
    params = _params([0, 1, 2])
    text = main_table.latex(summary, params)
    assert _balanced(text)
    assert text.count("\\begin{tabular}") == text.count("\\end{tabular}") == 1
    assert "MS on kept\\_1 \\& 50\\%" in text and "\\textbf{90.0}" in text
    assert "30.0 $\\pm$ 10.0" in text and "\\multicolumn{2}{c}{sym50}" in text
    header = next(line for line in text.splitlines() if line.startswith("\\begin{tabular}"))
    assert header == "\\begin{tabular}{lrrrr}"
    for row in (line for line in text.splitlines() if line.endswith("\\\\") and "multicolumn" not in line):
        assert row.count(" & ") == 4  # every row fills every column


def test_selection_summary_averages_final_scores_of_selecting_runs_only():
    table = selection_summary(_per_seed())
    assert table["method"].tolist() == ["prism"]
    assert table["final_diag_selection_precision"].iloc[0] == pytest.approx(0.81)
    assert table["clean_fraction"].iloc[0] == 0.5 and table["seeds"].iloc[0] == 3


def test_embedding_size_summary_places_runs_by_their_point_and_uses_the_sample_sd():
    from noisydml.studies.bspml import embedding_size_lines, embedding_size_summary

    rows = [{**KEYS, "noise": "sympc20", "method": f"{m}_dim{d}", "run_kind": "embedding_size", "seed": s,
             "recall_at_1": r + s / 10, "precision_at_1": r + s / 10, "mean_average_precision_at_r": r / 10}
            for m, d, r in (("ms_rho1", 16, 0.3), ("ms_rho1", 32, 0.4), ("bspml", 16, 0.35)) for s in (0, 1)]
    from noisydml.runs import Run
    from noisydml.studies.bspml import EMBEDDING_SIZE

    sizes = {f"{m}_dim{d}": Run(EMBEDDING_SIZE, "", "glyphs", "sympc20", f"{m}_dim{d}", 0, m, point={"embedding_dim": d})
             for m in ("ms_rho1", "bspml") for d in (16, 32)}
    table = embedding_size_summary(pd.DataFrame(rows), sizes).set_index(["method", "embedding_dim"])
    assert table.loc[("ms_rho1", 32), "recall_at_1"] == pytest.approx(0.45)
    assert table.loc[("ms_rho1", 32), "recall_at_1_std"] == pytest.approx(np.sqrt(0.005))  # ddof=1
    assert table.loc[("bspml", 16), "seeds"] == 2
    lines = embedding_size_lines(table.reset_index(), {"dataset": "glyphs", "noise": "sympc20"})
    assert "| method | d = 16 | d = 32 |" in lines
    assert "| bspml | 40.00 ± 7.07 | - |" in lines
    assert "opt-in" in embedding_size_lines(embedding_size_summary(pd.DataFrame(), sizes), {"noise": "sympc20"})[0]


def test_figure_panels_hold_at_most_eight_runs_split_evenly_and_keep_every_run():
    from noisydml.reporting.figures import panels

    runs = [f"r{i}" for i in range(12)] + ["x", "y"]
    out = panels(runs, {"first": [f"r{i}" for i in range(9)], "empty": ["nothing"], "second": ["r9", "r10", "r11"]})
    assert [(title, len(members)) for title, members in out] == [
        ("first (1/2)", 4), ("first (2/2)", 5), ("second", 3), ("other", 2)]  # a group with no run: no panel
    assert [r for _, members in out for r in members] == runs
