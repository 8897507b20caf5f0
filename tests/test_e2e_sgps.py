"""SGPS end to end: `dvc repro` of a grid sgps run, its posterior data clean chain (stage 2 on the exported c^B as
cluster labels, stage 3 from stage 2's weights) and one ablation variant, in a temporary repository; then, on
the same repository, the chain's stage 2 on two processes (torchrun, gloo) killed and resumed through DVC, and
`dvc exp run -S train.optimizer.lr=3e-05`.

Why it is slow (about three minutes on 2 cores): ten stages, each a process importing torch, MLflow and faiss;
the chain's three stages must run one after the other. Its own file, so it runs beside test_e2e.py (the two
checks at its end were test_e2e.py's, moved here to balance the two workers).
"""

import json
import subprocess
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
    raw["methods"]["sgps"]["sgm"].update(thresholds="absolute", lambda_max=0.9, lambda_min=0.0, merge_min_similarity=-1.0,
                                         start_epoch=0)
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
    # the stages' headings name the runs by their report labels (params.yaml report.labels), never by internal ids
    assert {"stage 1: SGPS P@1", "stage 2: PRISM on SGPS-cleaned labels P@1",
            "stage 3: SGPS + posterior data clean P@1"} <= set(table)
    md = (root / "reports" / "results.md").read_text()
    assert "Posterior data clean" in md and "c^B purity" in md and "| mean |" not in md
    assert (root / "reports" / "figures" / "sgps-curves_over_training.png").is_file()


def test_ablation_variant_is_its_own_run_and_report_row(repo):
    root, env, out = repo
    assert "Running stage 'train_sgps_ablation@mean-0'" in out
    run = root / "runs" / "glyphs" / "sym50" / "sgps_mean" / "seed0"
    saved = __import__("torch").load(run / "model.pt", weights_only=False)
    assert saved["method_name"] == "sgps"
    table = pd.read_csv(root / "reports" / "studies" / "sgps" / "sgps_ablations.csv")
    assert table["variant"].tolist() == ["mean"] and table["overrides"].iloc[0] == "ppm=mean"
    assert _run([sys.executable, "-m", "dvc", "status", "-q"], root, env) == ""


def _lock(root):
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]


CHAIN = "train_chain@sgps_posterior_stage2"


def _mlflow_statuses(root, env, run_name: str) -> list[str]:
    code = (
        "import mlflow, json;"
        f"mlflow.set_tracking_uri('sqlite:///{root / 'mlflow.db'}');"
        f"runs = mlflow.search_runs(experiment_names=['noisydml-glyphs'], filter_string=\"tags.mlflow.runName = '{run_name}'\");"
        "print(json.dumps(sorted(runs['status'])))"
    )
    return json.loads(run_command([sys.executable, "-c", code], root, env).strip().splitlines()[-1])


def _set_processes(root, processes: int) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["runtime"]["processes"] = processes  # runtime is not a DVC param: the stage stays up to date
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_a_chained_run_on_two_processes_is_a_dvc_edge_and_resumes_bit_exactly(repo):
    """The chain's stage depends on its upstream's folder (a DVC edge). ``runtime.processes: 2``: the stage
    relaunches itself under torchrun (gloo on the CPU); rank 0 alone writes the run folder and the MLflow run;
    killed after its first epoch and resumed by `dvc repro`, it writes the same outputs bit for bit (and continues
    the same MLflow run). A retrained upstream re-trains it."""
    root, env, _ = repo
    dot = _run([sys.executable, "-m", "dvc", "dag", "--dot", CHAIN], root, env)
    assert f'"train@glyphs-sym50-sgps-0" -> "{CHAIN}"' in dot
    run = root / "runs" / "glyphs" / "sym50" / "sgps_posterior_stage2" / "seed0"
    assert json.loads((run / "run.json").read_text())["upstream"]["run"] == "runs/glyphs/sym50/sgps/seed0"
    before = _mlflow_statuses(root, env, "sgps_posterior_stage2 · sym50 · seed 0")
    _set_processes(root, 2)
    try:
        out = _run([sys.executable, "-m", "dvc", "repro", "-f", "-s", CHAIN], root, env)
        assert "runtime.processes = 2: " in out and "torch.distributed.run --standalone --nproc_per_node=2" in out
        info = json.loads((run / "run.json").read_text())
        assert info["environment"]["gpu_settings"]["distributed"] == {"processes": 2, "backend": "gloo",
                                                                      "sync_batchnorm": False}
        assert len(pd.read_csv(run / "history.csv")) == 2
        whole = _lock(root)[CHAIN]["outs"][0]["md5"]
        killed = subprocess.run([sys.executable, "-m", "dvc", "repro", "-f", "-s", CHAIN], cwd=root,
                                env={**env, "NOISYDML_STOP_AFTER_EPOCH": "1"}, capture_output=True, text=True,
                                timeout=600)
        assert killed.returncode != 0 and "stopped after epoch 1" in killed.stdout + killed.stderr
        out = _run([sys.executable, "-m", "dvc", "repro", "-f", "-s", CHAIN], root, env)
        assert "resuming from" in out and "after epoch 1 of 2" in out
        assert _lock(root)[CHAIN]["outs"][0]["md5"] == whole
        # two MLflow runs more: the whole one, and the killed one resumed (one run); rank 1 made none
        assert _mlflow_statuses(root, env, "sgps_posterior_stage2 · sym50 · seed 0") == sorted(
            before + ["FINISHED", "FINISHED"])
    finally:
        _set_processes(root, 1)
    # a retrained upstream re-trains the chain
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["methods"]["sgps"]["temperature"] = params["methods"]["sgps"]["temperature"] * 2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _run([sys.executable, "-m", "dvc", "repro", CHAIN], root, env)
    assert "Running stage 'train@glyphs-sym50-sgps-0'" in out and f"Running stage '{CHAIN}'" in out


def test_a_learning_rate_dvc_writes_as_3e_05_trains(repo):
    """``-S train.optimizer.lr=3e-05`` through the real ``dvc exp run``: DVC writes ``3e-05``, which the stages read
    as a float (YAML 1.2), and the run trains. Last in the module: it leaves every other train stage stale."""
    root, env, _ = repo
    out = _run([sys.executable, "-m", "dvc", "exp", "run", "-S", "train.optimizer.lr=3e-05",
                "train@glyphs-sym50-sgps-0"], root, env)
    assert "Running stage 'train@glyphs-sym50-sgps-0'" in out, out
    assert "lr: 3e-05" in (root / "params.yaml").read_text()
    lock_lr = _lock(root)["train@glyphs-sym50-sgps-0"]["params"]["params.yaml"]["train"]["optimizer"]["lr"]
    assert float(lock_lr) == 3e-05  # (PyYAML, reading the lock here, gives the str)
