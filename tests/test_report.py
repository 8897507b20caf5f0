"""The report's tables: per-seed summary (sample standard deviation), the Markdown layout, selection scores."""

import numpy as np
import pandas as pd
import pytest

from noisydml.reporting import main_table
from noisydml.reporting.tables import selection_summary, summarise

KEYS = dict(dataset="glyphs", noise_kind="symmetric", noise_rate=0.5, actual_noise_rate=0.5)


def _counts(p1: float) -> dict:
    """Per-class P@1 counts of a run with this P@1: 10 test classes of 10 queries, the hits spread evenly."""
    hits = round(100 * p1)
    return {"classes": list(range(10)), "queries": [10] * 10, "hits": [hits // 10 + (c < hits % 10) for c in range(10)]}


def _per_seed():
    rows = []
    for method, p1 in (("ms", [0.2, 0.3, 0.4]), ("prism", [0.5, 0.6, 0.7])):
        for seed, v in enumerate(p1):
            rows.append({**KEYS, "noise": "sym50", "method": method, "run_kind": "grid", "seed": seed,
                         "precision_at_1": v, "mean_average_precision_at_r": v / 10,
                         "per_class_precision_at_1": _counts(v),
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
                       "labels": {"ms": "MS", "ms_on_prism_kept": "MS on kept_1 & 50%"}, "panels": {},
                       "reference_rows": {}}}


def test_summary_uses_the_sample_standard_deviation():
    summary = summarise(_per_seed(), ["precision_at_1"]).set_index("method")
    assert summary.loc["ms", "precision_at_1"] == pytest.approx(0.3)
    assert summary.loc["ms", "precision_at_1_std"] == pytest.approx(0.1)  # ddof=1: sqrt(0.02 / 2)
    assert summary.loc["ms", "seeds"] == 3 and np.isnan(summary.loc["ms_on_prism_kept", "precision_at_1_std"])


NAMES = {("glyphs", "sym50"): "50% symmetric", ("glyphs", "clean"): "clean labels"}


def test_main_table_rows_columns_cells_and_bold_only_beyond_the_spread():
    summary = summarise(_per_seed(), ["precision_at_1", "mean_average_precision_at_r"])
    text = "\n".join(main_table.markdown(summary, _params([0, 1, 2]), NAMES))
    assert "n = 1/3 seeds (mean ± sample standard deviation (ddof=1); rows of fewer seeds say how many" in text
    assert main_table.BOLD_RULE in text
    assert ("| Method | 50% symmetric P@1 | 50% symmetric MAP@R | clean labels P@1 | clean labels MAP@R |"
            in text)
    assert "| MS | 30.00 ± 10.00 | 3.00 ± 1.00 | – | – |" in text
    # prism leads MS by 30 points, more than both sds (10), but the one-seed chain has no sd: no row is bold
    assert "| prism | 60.00 ± 10.00 | 6.00 ± 1.00 | – | – |" in text  # no label: the run's name
    assert "| MS on kept_1 & 50% (n = 1) | 90.00 | 9.00 | – | – |" in text  # one seed: no ±, never bold
    assert "**" not in text.split("| Method |")[1].split("\n\n")[0]
    assert "- –: not run" in text
    assert "MS = `ms`" in text and "prism = " not in text
    assert main_table.row_names(_params([0])) == ["ms", "prism", "ms_on_prism_kept"]


def test_main_table_bolds_a_lead_beyond_both_sds_and_nothing_within():
    per_seed = _per_seed()
    per_seed = per_seed[per_seed["method"] != "ms_on_prism_kept"]
    summary = summarise(per_seed, ["precision_at_1", "mean_average_precision_at_r"])
    text = "\n".join(main_table.markdown(summary, _params([0, 1, 2]), NAMES))
    assert "| prism | **60.00 ± 10.00** | **6.00 ± 1.00** | – | – |" in text  # leads by 30 > 10 and 3 > 1
    # a lead within the spread: 0.5 points against sds of 10
    close = per_seed.assign(precision_at_1=[v + (0.295 if m == "ms" else 0) for v, m in
                                            zip(per_seed["precision_at_1"], per_seed["method"])])
    text = "\n".join(main_table.markdown(summarise(close, ["precision_at_1", "mean_average_precision_at_r"]),
                                         _params([0, 1, 2]), NAMES))
    assert "| prism | 60.00 ± 10.00 | **6.00 ± 1.00** |" in text


def test_one_seed_table_claims_no_ordering():
    per_seed = _per_seed()
    per_seed = per_seed[per_seed["seed"] == 0]
    summary = summarise(per_seed, ["precision_at_1", "mean_average_precision_at_r"])
    for text in ("\n".join(main_table.markdown(summary, _params([0]), NAMES)),
                 main_table.latex(summary, _params([0]), NAMES)):
        assert main_table.ONE_SEED in text
        cells = text.split("Method", 1)[1]  # the caption is bold; no cell is
        assert "**" not in cells and "textbf" not in cells


def test_reference_rows_sit_beneath_the_methods_with_their_footnote_and_are_never_bold():
    per_seed = _per_seed()
    frozen = per_seed[per_seed["method"] == "prism"].assign(method="frozen", precision_at_1=0.99)
    summary = summarise(pd.concat([per_seed, frozen]), ["precision_at_1", "mean_average_precision_at_r"])
    params = _params([0, 1, 2])
    params["grid"]["methods"] = ["ms", "frozen", "prism"]
    params["report"]["reference_rows"] = {"frozen": "the pretrained backbone's numbers"}
    lines = main_table.markdown(summary, params, NAMES)
    rows = [line.split(" |")[0] for line in lines if line.startswith("| ")]
    assert rows == ["| Method", "| MS", "| prism", "| MS on kept_1 & 50% (n = 1)", "| *for reference, not a method:*",
                    "| frozen"]
    assert "| frozen | 99.00 ± 0.00 |" in "\n".join(lines)  # the best mean, not bold: not a method
    assert "- frozen: the pretrained backbone's numbers" in lines
    assert main_table.method_rows(params) == ["ms", "prism", "ms_on_prism_kept"]


def test_claimed_orderings_are_paired_per_seed_with_a_verdict():
    from noisydml.reporting import orderings
    from noisydml.studies.base import Claim

    table = orderings.paired(_per_seed(), [("prism", Claim("prism", "ms", "PRISM above MS"))], "precision_at_1",
                             NAMES, str.upper)
    row = table.iloc[0]
    assert row["differences"] == pytest.approx([30.0, 30.0, 30.0]) and row["agree"] == 3
    assert row["verdict"] == orderings.HOLDS and row["noise_name"] == "50% symmetric"
    text = "\n".join(orderings.section(table, "precision_at_1"))
    assert "| prism | PRISM above MS | PRISM vs MS | glyphs | 50% symmetric | +30.00, +30.00, +30.00 | +30.00 | " \
           "[+30.00, +30.00] | [+30.00, +30.00] | 3 of 3 | holds |" in text
    assert row["class_low"] == pytest.approx(30.0) and "smallest difference this grid decides" in text
    one = orderings.paired(_per_seed()[lambda d: d["seed"] == 0], [("prism", Claim("prism", "ms", "x"))],
                           "precision_at_1", NAMES, str)
    text = "\n".join(orderings.section(one, "precision_at_1"))
    assert orderings.ONE_SEED in text and "| holds |" not in text
    assert orderings.to_csv_rows(table)["differences"].iloc[0] == "30.0000;30.0000;30.0000"


def test_each_ordering_comes_with_the_claimed_methods_decisions_per_seed_and_a_robustness_summary():
    from noisydml.reporting import orderings
    from noisydml.studies.base import Claim

    per_seed = _per_seed()
    per_seed["final_diag_selection_precision"] = np.where(per_seed["method"] == "prism", 0.9 + per_seed["seed"] / 100,
                                                          np.nan)
    per_seed["final_diag_positive_precision"] = np.nan  # never measured: left out, not shown as NaN
    claim = Claim("prism", "ms", "PRISM above MS", diagnostics=(("final_diag_selection_precision", "kept: clean share"),
                                                               ("final_diag_positive_precision", "positives")))
    reversed_claim = Claim("ms", "prism", "MS above PRISM")
    table = orderings.paired(per_seed, [("prism", claim), ("ms", reversed_claim)], "precision_at_1", NAMES, str.upper)
    assert table.iloc[0]["diagnostics"] == "kept: clean share: 90.0%, 91.0%, 92.0%"
    text = "\n".join(orderings.section(table, "precision_at_1"))
    assert "| holds | kept: clean share: 90.0%, 91.0%, 92.0% |" in text and "positives" not in text
    assert "| reversed | – |" in text
    assert "- prism, PRISM above MS: holds on glyphs 50% symmetric." in text
    assert "- ms, MS above PRISM: reversed on glyphs 50% symmetric." in text


def test_figure_colours_one_per_run_everywhere_and_lines_only_over_three_rates(tmp_path, monkeypatch):
    from noisydml.reporting import figures

    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, path, vector=False: drawn.append(fig))
    rows = []
    for method in ("a", "b"):
        for kind, rates in (("symmetric", (0.0, 0.5)), ("small_cluster", (0.0, 0.25, 0.5))):
            rows += [{"dataset": "glyphs", "method": method, "noise": f"{kind}{r}", "noise_kind": "none" if r == 0
                      else kind, "noise_rate": r, "seeds": 1, "precision_at_1": 0.5, "precision_at_1_std": np.nan}
                     for r in rates]
    points = pd.DataFrame(rows).drop_duplicates(["method", "noise_kind", "noise_rate"])
    points = figures.noise_points(points, "precision_at_1", {"one": ["a"], "two": ["b"]}, {})
    figures.plot_metric_vs_noise(points, "precision_at_1", tmp_path / "x.png", "P@1")
    axes = drawn[0].axes
    colours = {}
    for ax in axes:
        for container in ax.containers:
            line = container.lines[0]
            colours.setdefault(container.get_label(), set()).add(line.get_color() if isinstance(line.get_color(), str)
                                                                  else tuple(line.get_color()))
            joined = line.get_linestyle() != "None"
            assert joined == ("small-cluster" in ax.get_title() or "small_cluster" in ax.get_title()), ax.get_title()
    assert set(colours) == {"a", "b"} and all(len(c) == 1 for c in colours.values())  # one colour per run
    assert colours["a"] != colours["b"]
    assert "one seed: no ordering is claimed" in drawn[0]._suptitle.get_text()


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
    text = main_table.latex(summary, params, NAMES)
    assert _balanced(text)
    assert text.count("\\begin{tabular}") == text.count("\\end{tabular}") == 1
    assert "MS on kept\\_1 \\& 50\\% (n = 1)" in text and "90.00" in text and "\\textbf" not in text
    assert "30.00 $\\pm$ 10.00" in text and "\\multicolumn{2}{c}{50\\% symmetric}" in text
    header = next(line for line in text.splitlines() if line.startswith("\\begin{tabular}"))
    assert header == "\\begin{tabular}{lrrrr}"
    for row in (line for line in text.splitlines() if line.endswith("\\\\") and "multicolumn" not in line
                and not line.startswith("\\par")):
        assert row.count(" & ") == 4  # every row fills every column
    assert "--: not run" in text


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


def test_each_row_states_the_epochs_behind_its_final_model_and_its_images_per_step():
    from noisydml.reporting import budget

    chain = {"dataset": "glyphs", "noise": "sym50", "labels": {"label": "", "keep": ""}}
    params = {"train": {"batch": {"classes": 16, "per_class": 4}},
              "methods": {"prism": {}, "sgps": {"positive_source": "forward", "positives_per_sample": 4,
                                                 "sgm": {"start_epoch": 4}}},
              "chains": {"stage2": {**chain, "name": "stage2", "method": "prism", "upstream": "sgps",
                                    "init": {"model": False, "method": False}},
                         "post": {**chain, "name": "post", "method": "sgps", "upstream": "stage2",
                                  "init": {"model": True, "method": False}}}}
    per_seed = pd.DataFrame([{"dataset": "glyphs", "noise": "sym50", "method": m, "seed": 0, "selected_epoch": e}
                             for m, e in (("sgps", 12), ("prism", 12), ("stage2", 9), ("post", 12))])
    rows = budget.table(per_seed, params, ["sgps", "prism", "stage2", "post"], str.upper).set_index("run")
    assert rows.loc["post", "epochs behind the final model"] == 21  # its own 12 + stage 2's selected 9
    assert rows.loc["post", "upstream epochs used as labels or inputs"] == 12  # sgps's, through stage 2's labels
    assert rows.loc["stage2", "epochs behind the final model"] == 9
    assert rows.loc["sgps", "images per step"] == "64, 320 from epoch 5"
    assert rows.loc["post", "images per step"] == "64, 320 from epoch 5" and rows.loc["prism", "images per step"] == "64"
    assert "| POST " in "\n".join(budget.markdown(budget.table(per_seed, params, ["post"], str.upper)))


def test_a_tuned_row_is_said_to_be_tuned_where_its_baseline_is_not():
    from noisydml.reporting import budget

    params = {"train": {"batch": {"classes": 16, "per_class": 4}}, "methods": {"prism": {}, "mcl": {}}, "chains": {}}
    per_seed = pd.DataFrame([{"dataset": "glyphs", "noise": "sym50", "method": m, "seed": 0, "selected_epoch": 12}
                             for m in ("mcl", "prism", "prism_tuned")])
    table = budget.table(per_seed, params, ["mcl", "prism", "prism_tuned"], str)
    assert list(table["hyper-parameters"]) == ["params.yaml", "params.yaml", "tuned on held-out classes"]
    text = "\n".join(budget.markdown(table))
    assert "**Tuned rows** (prism_tuned)" in text and "untuned baseline" in text
    assert "Tuned rows" not in "\n".join(budget.markdown(table[table["run"] != "prism_tuned"]))
