"""SGPS end to end: `dvc repro` of a grid sgps run, its posterior data clean chain (stage 2 on the exported c^B as
cluster labels, stage 3 from stage 2's weights) and one ablation variant, in a temporary repository.

Why it is slow (about a minute on 2 cores): ten stages, each a process importing torch, MLflow and faiss; the
chain's three stages must run one after the other. Its own file, so it runs beside test_e2e.py.
"""

import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import REPO, dvc_repo, run_command, tiny_params

pytestmark = pytest.mark.e2e

_run = run_command


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e_sgps")
    raw = tiny_params(yaml.safe_load((REPO / "params.yaml").read_text()))
    raw["grid"].update(noises=["sym50"], methods=["sgps"], seeds=[0], run_noises=[])
    raw["train"].update(pretrained="none", epochs=2, batch={"classes": 2, "per_class": 2})
    raw["methods"]["sgps"].update(memory_size=64, positives="both")
    raw["methods"]["sgps"]["sgm"].update(lambda_max=0.9, lambda_min=0.0, merge_min_similarity=-1.0, start_epoch=0)
    raw["figures"]["bspml_maps"] = {}
    raw["figures"]["sgps_ablations"].update(train=["mean"], seeds=[0])
    raw["chains"] = {k: v for k, v in raw["chains"].items() if k.startswith("sgps_posterior")}
    raw["chains"]["sgps_posterior_stage2"]["train"] = {"validation_classes": 1, "model_selection": "best_validation"}
    env, out = dvc_repo(root, raw)
    return root, env, out


def test_posterior_chain_runs_in_order_and_reports_each_stage(repo):
    root, env, out = repo
    order = [out.index(f"Running stage '{s}'") for s in
             ("train@glyphs-sym50-sgps-0", "train_chain@sgps_posterior_stage2", "train_chain@sgps_posterior")]
    assert order == sorted(order)
    runs = root / "runs" / "glyphs" / "sym50"
    exports = np.load(runs / "sgps" / "seed0" / "exports.npz")
    assert {"bottom_up_label", "bottom_up_keep", "keep"} <= set(exports)
    stage2 = yaml.safe_load((runs / "sgps_posterior_stage2" / "seed0" / "run.json").read_text())
    assert stage2["model_selection"] == "best_validation" and stage2["trained_samples"] < len(exports["sample_id"])
    table = pd.read_csv(root / "reports" / "studies" / "sgps" / "sgps_posterior.csv")
    assert len(table) == 1 and 0 < table["purity"].iloc[0] <= 1 and 0 < table["coverage"].iloc[0] <= 1
    assert {"stage 1: sgps P@1", "stage 2: sgps_posterior_stage2 P@1", "stage 3: sgps_posterior P@1"} <= set(table)
    md = (root / "reports" / "results.md").read_text()
    assert "Posterior data clean" in md and "c^B purity" in md and "| mean |" not in md
    assert (root / "reports" / "studies" / "sgps" / "curves_over_training.png").is_file()


def test_ablation_variant_is_its_own_run_and_report_row(repo):
    root, env, out = repo
    assert "Running stage 'train_sgps_ablation@mean-0'" in out
    run = root / "runs" / "glyphs" / "sym50" / "sgps_mean" / "seed0"
    saved = __import__("torch").load(run / "model.pt", weights_only=False)
    assert saved["method_name"] == "sgps"
    table = pd.read_csv(root / "reports" / "studies" / "sgps" / "sgps_ablations.csv")
    assert table["variant"].tolist() == ["mean"] and table["overrides"].iloc[0] == "ppm=mean"
    assert _run([sys.executable, "-m", "dvc", "status", "-q"], root, env) == ""
