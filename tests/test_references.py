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
    # whose settings fill a cell: SGPS's reprints of PRISM's numbers are PRISM's, its re-runs and new cells its own
    sgps3 = refs[(refs["table"] == "Table III") & (refs["metric"] == "precision_at_1")].set_index(["method", "dataset"])
    assert sgps3.loc[("prism", "cars98n"), "settings_of"] == "sgps"  # 58.27, re-run (PRISM: 57.95)
    assert sgps3.loc[("prism", "food101n"), "settings_of"] == "prism"  # 52.47 in both
    assert sgps3.loc[("proxynca", "cars98n"), "settings_of"] == "prism"
    assert sgps3.loc[("fastap", "food101n"), "settings_of"] == "sgps"  # no FastAP row in PRISM's Table 3
    assert set(refs.loc[refs["paper"] == "PRISM", "settings_of"]) == {"prism"}
    assert (refs["settings_of"] == "prism").sum() == 240 + 217  # PRISM's cells and SGPS's reprints of them


def _summary(rows):
    return pd.DataFrame([{"dataset": d, "noise": n, "method": m, "noise_rate": r, "precision_at_1": p,
                          "mean_average_precision_at_r": 0.1, "seeds": 1} for d, n, m, r, p in rows])


PARAMS = {"datasets": {"cub": {"kind": "cub200"}, "glyphs": {"kind": "glyphs"}}, "report": {"settings_of": "prism"}}
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
    assert status.loc[("SGPS", "Table IV"), "status"] == "not run"  # its face rows are implemented


def _face_summary(rows):
    return pd.DataFrame([{"dataset": d, "noise": "clean", "method": m, "noise_rate": 0.0, "precision_at_1": 0.9,
                          "mean_average_precision_at_r": 0.5, "lfw_accuracy": lfw, "tar_at_far_1e-05": tar,
                          "seeds": 1} for d, m, lfw, tar in rows])


def test_face_cells_fill_from_real_face_data_and_synthetic_faces_stay_apart():
    """SGPS Table IV: a local MS1MV0-like set (variant noisy) fills the MS1MV0 cells, differenced, its IJB-C TAR
    under the IJB-C columns; the synthetic faces get columns of their own; a row we lack says why under the table."""
    refs = load_references(REPO / "references" / "papers")
    table = refs[(refs["paper"] == "SGPS") & (refs["table"] == "Table IV")]
    params = {"datasets": {"ms1mv0": {"kind": "faces", "source": "local", "variant": "noisy", "ijb_name": "ijbc"},
                           "faces": {"kind": "faces", "source": "synthetic", "variant": "noisy", "ijb_name": "ijbc"}},
              "report": {"settings_of": "sgps"}}
    stats = {(d, "clean"): {"kind": "none", "settings": {}} for d in ("ms1mv0", "faces")}
    ours = our_cells(_face_summary([("ms1mv0", "dcq", 99.5, 50.0), ("faces", "dcq", 97.0, 24.0)]), params, stats)
    lines, ran = side_by_side(table, ours, {"faces"})
    header, dcq = lines[0], next(line for line in lines if line.startswith("| DCQ (`dcq`)"))
    assert "MS1MV0 LFW" in header and "MS1MV2 IJB-C TAR@1e-05" in header
    assert "ours: faces (LFW; not a paper dataset)" in header and "ours: faces (IJB-C TAR@1e-05; not" in header
    assert "99.65 · ours 99.50 (-0.15)" in dcq and "53.86 · ours 50.00 (-3.86)" in dcq
    assert "90.23 · ours" not in dcq  # IJB-B: this set read IJB-C
    assert dcq.count("97.00") == 1 and dcq.count("24.00") == 1  # the synthetic columns, not differenced
    assert any(line.startswith("‡ F²C: not implemented") for line in lines)
    assert not any(line.startswith("‡ DCQ + SKH") for line in lines)  # built (ours: how they combine)
    assert status_table(table, ours).loc[0, "run on the paper's data"] == 1


def test_a_cell_is_filled_only_by_runs_under_the_settings_of_the_paper_whose_number_it_holds():
    """An SGPS-settings `prism` run never fills PRISM's cell (nor SGPS's reprint of it): it shows beneath, labelled,
    undifferenced; it fills SGPS's own PRISM-MCL cells (small-cluster: re-run by the SGPS authors). A PRISM-settings
    run fills PRISM's cell and SGPS's reprint of it."""
    refs = load_references(REPO / "references" / "papers")
    stats = {**STATS, ("cub", "prism_sc50"): {"kind": "published_list", "settings": {"noise_model": "small_cluster"}}}
    summary = _summary([("cub", "prism_sym50", "prism", 0.5, 0.5503), ("cub", "prism_sc50", "prism", 0.5, 0.50)])
    table1 = refs[(refs["paper"] == "PRISM") & (refs["table"] == "Table 1")]
    sgps = our_cells(summary, {**PARAMS, "report": {"settings_of": "sgps"}}, stats)
    lines, ran = side_by_side(table1, sgps, {"cub200", "cars196", "sop"})
    assert ran == 0
    row = next(line for line in lines if line.startswith("| MCL + PRISM"))
    assert "ours" not in row
    beneath = lines[lines.index(row) + 1]
    assert beneath.startswith("| ↳ MCL + PRISM (Ours): ours under SGPS's settings") and "ours 55.03" in beneath
    assert "(" not in beneath.split("|", 2)[2]  # never differenced
    status = status_table(refs, sgps).set_index(["paper", "table"])
    assert status.loc[("PRISM", "Table 1"), "run on the paper's data"] == 0
    assert status.loc[("SGPS", "Table I"), "run on the paper's data"] == 0  # PRISM-MCL at 50%: PRISM's number
    assert status.loc[("SGPS", "Table II"), "run on the paper's data"] == 1  # re-run by the SGPS authors
    prism = our_cells(summary, PARAMS, stats)
    status = status_table(refs, prism).set_index(["paper", "table"])
    assert status.loc[("PRISM", "Table 1"), "run on the paper's data"] == 1
    assert status.loc[("SGPS", "Table I"), "run on the paper's data"] == 1
    assert status.loc[("SGPS", "Table II"), "run on the paper's data"] == 0
    md, _ = reference_section(refs, summary, {**PARAMS, "report": {"settings_of": "sgps"}}, stats)
    assert "### PRISM Table 1:" in "\n".join(md)  # shown for its labelled row alone
    none = our_cells(summary, {**PARAMS, "report": {"settings_of": "none"}}, stats)
    assert status_table(refs, none)["run on the paper's data"].sum() == 0  # the default grid fills no paper cell


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
    assert status_table(one, ours)["status"].tolist() == ["reproduced within 2 points"]
    md, _ = reference_section(one, _summary([("cub", "prism_sym50", "prism", 0.5, 0.5450)]), PARAMS, STATS)
    assert any("56.03 · ours 54.50 (-1.53)" in line for line in md)


def test_footnoted_rows_are_marked_by_the_tables_own_column():
    """SGPS Table I's SGPS-MCL row (the posterior strategy, per its caption) carries ‡ and its note below the table;
    the mark comes from the CSV's footnote column, never from the note's wording."""
    refs = load_references(REPO / "references" / "papers")
    assert set(refs.loc[refs["footnote"] == "yes", "row"]) == {  # and SGPS Table IV's rows we lack, with why
        "SGPS-MCL (posterior strategy per caption)", "NT", "NR", "Co-mining", "F²C"}
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
