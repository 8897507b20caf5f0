"""The report's tables: per-seed summary (sample standard deviation), the Markdown layout, selection scores."""

import numpy as np
import pandas as pd
import pytest

from noisydml.reporting.tables import markdown_table, row_names, selection_summary, summarise

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
            "train": {"model_selection": "last", "validation_classes": 0}}


def test_summary_uses_the_sample_standard_deviation():
    summary = summarise(_per_seed(), ["precision_at_1"]).set_index("method")
    assert summary.loc["ms", "precision_at_1"] == pytest.approx(0.3)
    assert summary.loc["ms", "precision_at_1_std"] == pytest.approx(0.1)  # ddof=1: sqrt(0.02 / 2)
    assert summary.loc["ms", "seeds"] == 3 and np.isnan(summary.loc["ms_on_prism_kept", "precision_at_1_std"])


def test_markdown_table_rows_columns_and_cells():
    summary = summarise(_per_seed(), ["precision_at_1", "mean_average_precision_at_r"])
    text = markdown_table(summary, ["precision_at_1", "mean_average_precision_at_r"], _params([0, 1, 2]))
    assert "sample standard deviation, ddof=1" in text
    assert "| method | glyphs / sym50 | glyphs / clean |" in text
    assert "| ms | 30.0±10.0 / 3.0±1.0 | - |" in text
    assert "| ms_on_prism_kept | 90.0 / 9.0 | - |" in text  # one seed: no ± for a chained run
    assert row_names(_params([0])) == ["ms", "prism", "ms_on_prism_kept"]


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

    sizes = {f"{m}_dim{d}": Run("embedding_size", "", "glyphs", "sympc20", f"{m}_dim{d}", 0, m, point={"embedding_dim": d})
             for m in ("ms_rho1", "bspml") for d in (16, 32)}
    table = embedding_size_summary(pd.DataFrame(rows), sizes).set_index(["method", "embedding_dim"])
    assert table.loc[("ms_rho1", 32), "recall_at_1"] == pytest.approx(0.45)
    assert table.loc[("ms_rho1", 32), "recall_at_1_std"] == pytest.approx(np.sqrt(0.005))  # ddof=1
    assert table.loc[("bspml", 16), "seeds"] == 2
    lines = embedding_size_lines(table.reset_index(), {"dataset": "glyphs", "noise": "sympc20"})
    assert "| method | d = 16 | d = 32 |" in lines
    assert "| bspml | 40.00 ± 7.07 | - |" in lines
    assert "opt-in" in embedding_size_lines(embedding_size_summary(pd.DataFrame(), sizes), {"noise": "sympc20"})[0]
