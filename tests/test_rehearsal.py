"""Rehearsals: a paper profile's exact overrides through real `dvc exp run` on miniature stand-ins of its
datasets (their real file formats) and random weights in the published key layout.

The miniatures and the rehearsal's overrides are checked for every profile in the default run (seconds); the
rehearsals themselves (minutes each) are marked ``rehearsal``: `python -m pytest -q -m rehearsal --dist load`."""

import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO, benchmark_params, serve_archives
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.prepare import prepare
from noisydml.pipeline.download import download
from noisydml.tools.profiles import load_profiles, params_after
from noisydml.tools.rehearsal import miniature, rehearsal_overrides, rehearse

PROFILES = load_profiles(REPO / "profiles")


@pytest.mark.parametrize("kind", ["cub200", "cars196", "sop", "inshop", "food101n", "cars98n"])
def test_each_miniature_is_read_by_the_real_layout_with_its_counts(kind, tmp_path, raw_params, local_server):
    base, served = local_server
    mini = miniature(kind, base)
    served.files.update(mini.served)
    archives = serve_archives(local_server, mini.archives)
    params = benchmark_params(raw_params, "d", {"kind": kind, "local_dir": "", "archives": archives,
                                                "expect": mini.expect})
    download(params, "d", Layout(tmp_path))
    info = prepare(params, "d", Layout(tmp_path))  # stops on any count other than the miniature's
    assert info["num_train_samples"] == mini.expect["train_samples"]


def test_every_profile_takes_the_rehearsal_overrides_through_dvc():
    for name, profile in PROFILES.items():
        params = params_after(profile["set"], REPO / "params.yaml")
        try:
            overrides = rehearsal_overrides(params, "http://127.0.0.1:1", {})
        except ValueError as e:  # a dataset kind without a miniature
            pytest.fail(f"{name}: {e}")
        rehearsed = params_after(profile["set"] + overrides, REPO / "params.yaml")
        assert rehearsed["report"]["rehearsal"] and rehearsed["train"]["epochs"] == 1
        assert rehearsed["grid"]["methods"] == params["grid"]["methods"]  # every cell of the table still runs


@pytest.mark.rehearsal
@pytest.mark.parametrize("name, filled", [  # the longest first: two workers share three rehearsals
    # 8 methods and RDML (tuned) x CUB and Cars (R@1)
    ("bspml/table1_cub_cars", {("BSPML", "Table 1"): 18, ("PRISM", "Table 3"): 0}),
    # SGPS's own cells on CARS-98N; the ones it reprints from PRISM and PRISM's own stay empty (PRISM's settings)
    ("sgps/table3_cars98n", {("SGPS", "Table III"): 15, ("PRISM", "Table 3"): 0}),
    # PRISM's cells, the three Co-teaching rows among them, and SGPS's reprints of 8 of them
    ("prism/table3_cars98n", {("PRISM", "Table 3"): 10, ("SGPS", "Table III"): 8}),
    # SGPS's face rows without a classifier: DCQ and DCQ + SGPS on the MS1MV0 stand-in, read from insightface's
    # files (RecordIO, .bin, IJB-C meta) by iResNet-50
    ("sgps/table4_pairwise", {("SGPS", "Table IV"): 2, ("SGPS", "Table III"): 0}),
])
def test_a_table_of_each_paper_is_rehearsed_through_dvc_exp_run(name, filled, tmp_path):
    # PRISM's CARS-98N rehearsal also runs the label audit of its PRISM runs (the real noise: no truth to judge by,
    # a contact sheet of the suspects)
    audit = ("figures.label_audit.datasets=[cars98n]", "figures.label_audit.methods=[prism]") \
        if name == "prism/table3_cars98n" else ()
    folder = rehearse(name, PROFILES[name], repo=REPO, folder=tmp_path / "repo", timeout=1800, extra=audit)
    report = (folder / "reports" / "results.md").read_text()
    assert "**Rehearsal**" in report
    if audit:
        sheet = folder / "audit" / "cars98n" / "clean" / "sheet"
        assert (sheet / "index.html").is_file() and len(pd.read_csv(sheet / "suspects.csv")) > 0
        assert not (sheet.parent / "judged.csv").exists()  # CARS-98N's noise is unlabelled: nothing judged
        assert "## Label audit" in report
    status = pd.read_csv(folder / "reports" / "paper_status.csv").set_index(["paper", "table"])
    assert {table: status.loc[table, "run on the paper's data"] for table in filled} == filled
    experiments = subprocess.run([sys.executable, "-m", "dvc", "exp", "list", "--name-only"], cwd=folder,
                                 capture_output=True, text=True, check=True).stdout
    assert f"rehearsal-{name.replace('/', '-')}" in experiments
