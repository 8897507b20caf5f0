"""The papers' tables as data and the side-by-side report section."""

import pandas as pd

from noisydml.reporting.references import load_references, reference_section, side_by_side, status_table, our_cells

from conftest import REPO


def test_reference_tables_hold_every_table_with_sources():
    refs = load_references(REPO / "references" / "papers")
    tables = set(zip(refs["paper"], refs["table"]))
    assert {("PRISM", "Table 1"), ("PRISM", "Table 2"), ("PRISM", "Table 3"), ("PRISM", "Timing"),
            ("BSPML", "Table 1"), ("BSPML", "Table 2"), *(("SGPS", f"Table {t}") for t in
                                                        ("I", "II", "III", "IV", "V", "VI"))} == tables
    cell = refs[(refs["paper"] == "PRISM") & (refs["table"] == "Table 1") & (refs["row"] == "MCL + PRISM (Ours)")
                & (refs["dataset"] == "cub200") & (refs["rate"] == 0.5)]
    assert cell["value"].tolist() == [56.03] and cell["method"].tolist() == ["prism"]
    posterior = refs[(refs["table"] == "Table I") & (refs["method"] == "sgps_posterior")]
    assert len(posterior) == 15 and posterior["note"].str.contains("posterior").all()
    bspml = refs[(refs["paper"] == "BSPML") & (refs["table"] == "Table 2") & (refs["row"] == "BSPML")
                 & (refs["dataset"] == "inshop") & (refs["rate"] == 0.3)]
    assert bspml[["value", "std"]].values.tolist() == [[62.04, 0.23]]


def _summary(rows):
    return pd.DataFrame([{"dataset": d, "noise": n, "method": m, "noise_rate": r, "precision_at_1": p,
                          "mean_average_precision_at_r": 0.1, "seeds": 1} for d, n, m, r, p in rows])


PARAMS = {"datasets": {"cub": {"kind": "cub200"}, "glyphs": {"kind": "glyphs"}}}
STATS = {("cub", "prism_sym50"): {"kind": "published_list", "settings": {"noise_model": "symmetric"}},
         ("glyphs", "sym50"): {"kind": "symmetric", "settings": {}}}


def test_cells_difference_on_paper_data_and_glyphs_apart():
    refs = load_references(REPO / "references" / "papers")
    summary = _summary([("cub", "prism_sym50", "prism", 0.5, 0.5503), ("glyphs", "sym50", "prism", 0.5, 0.4)])
    ours = our_cells(summary, PARAMS, STATS)
    lines, ran = side_by_side(refs[(refs["paper"] == "PRISM") & (refs["table"] == "Table 1")], ours,
                              {"cub200", "cars196", "sop"})
    assert ran == 2  # the cub cell and the glyphs column
    header, prism_row = lines[0], next(line for line in lines if line.startswith("| MCL + PRISM"))
    assert "ours: glyphs (50% P@1; not a paper dataset)" in header
    assert "56.03 · ours 55.03 (-1.00)" in prism_row and prism_row.rstrip(" |").endswith("40.00")
    status = status_table(refs, ours).set_index(["paper", "table"])
    assert status.loc[("PRISM", "Table 1"), "run on the paper's data"] == 1
    assert status.loc[("PRISM", "Table 1"), "status"] == "not yet"  # 1 of 81 cells run
    assert status.loc[("SGPS", "Table I"), "within 2 points"] == 1
    assert status.loc[("BSPML", "Table 1"), "status"] == "not run"
    assert status.loc[("SGPS", "Table IV"), "status"].startswith("not comparable")


def test_best_on_test_is_shown_beside_our_p_at_1_and_labelled():
    refs = load_references(REPO / "references" / "papers")
    summary = _summary([("cub", "prism_sym50", "prism", 0.5, 0.5503)])
    summary["best_on_test_precision_at_1"] = 0.5710
    ours = our_cells(summary, PARAMS, STATS)
    lines, _ = side_by_side(refs[(refs["paper"] == "PRISM") & (refs["table"] == "Table 1")], ours,
                            {"cub200", "cars196", "sop"})
    prism_row = next(line for line in lines if line.startswith("| MCL + PRISM"))
    assert "56.03 · ours 55.03 (-1.00) [best on test 57.10]" in prism_row
    md, _ = reference_section(refs, summary, PARAMS, STATS)
    assert "**test-selected**" in "\n".join(md)


def test_reproduced_when_every_cell_is_within_two_points():
    refs = load_references(REPO / "references" / "papers")
    one = refs[(refs["paper"] == "PRISM") & (refs["table"] == "Table 1") & (refs["row"] == "MCL + PRISM (Ours)")
               & (refs["dataset"] == "cub200") & (refs["rate"] == 0.5)]
    ours = our_cells(_summary([("cub", "prism_sym50", "prism", 0.5, 0.5350)]), PARAMS, STATS)
    assert status_table(one, ours)["status"].tolist() == ["not yet"]  # 2.53 points below the paper
    ours = our_cells(_summary([("cub", "prism_sym50", "prism", 0.5, 0.5450)]), PARAMS, STATS)
    assert status_table(one, ours)["status"].tolist() == ["reproduced within 2 P@1 points"]
    md, _ = reference_section(one, _summary([("cub", "prism_sym50", "prism", 0.5, 0.5450)]), PARAMS, STATS)
    assert any("56.03 · ours 54.50 (-1.53)" in line for line in md)


def test_footnoted_rows_are_marked_by_the_tables_own_column():
    """SGPS Table I's SGPS-MCL row (the posterior strategy, per its caption) carries ‡ and its note below the table;
    the mark comes from the CSV's footnote column, never from the note's wording."""
    refs = load_references(REPO / "references" / "papers")
    assert set(refs.loc[refs["footnote"] == "yes", "row"]) == {"SGPS-MCL (posterior strategy per caption)"}
    table = refs[(refs["paper"] == "SGPS") & (refs["table"] == "Table I")]
    ours = our_cells(_summary([]), PARAMS, STATS)
    lines, ran = side_by_side(table, ours, {"cub200", "cars196", "sop"})
    assert ran == 0
    marked = [line for line in lines if "‡" in line]
    assert len(marked) == 2 and marked[0].startswith("| SGPS-MCL (posterior strategy per caption) ‡")
    assert marked[1].startswith("‡ SGPS-MCL (posterior strategy per caption): the caption says")
    unmarked = table.assign(footnote="")
    assert not any("‡" in line for line in side_by_side(unmarked, ours, {"cub200", "cars196", "sop"})[0])


def test_tables_with_nothing_of_ours_are_one_status_line_each():
    refs = load_references(REPO / "references" / "papers")
    md, _ = reference_section(refs, _summary([("cub", "prism_sym50", "prism", 0.5, 0.5503)]), PARAMS, STATS)
    text = "\n".join(md)
    assert "### PRISM Table 1:" in text  # a cell of ours ran
    assert "### BSPML Table 1" not in text
    assert any(line.startswith("- BSPML Table 1 (") for line in md)
