"""One run on two processes through the train stage and DVC: the relaunch under torchrun (gloo on the CPU), rank 0
alone writing the run folder and the MLflow run, and a killed run resuming to the same outputs.

Why it is slow (about a minute on 2 cores): each of the three `dvc repro` calls starts the stage, torchrun and two
ranks, four processes that each import torch. Its repository holds only what the one run needs (no pretraining,
one noise setting, one method), and is its own file so that it runs beside test_e2e.py's larger repository.
"""

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from conftest import REPO, dvc_repo, run_command, tiny_params

pytestmark = pytest.mark.e2e

STAGE = "train@glyphs-clean-prism-0"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The stages the one run needs (download, prepare, corrupt), then the run on two processes, for two epochs."""
    root = tmp_path_factory.mktemp("e2e_ddp")
    raw = tiny_params(yaml.safe_load((REPO / "params.yaml").read_text()))
    raw["grid"].update(noises=["clean"], methods=["prism"], seeds=[0], run_noises=[])
    raw["train"].update(pretrained="none", epochs=2, batch={"classes": 2, "per_class": 2})
    raw["methods"]["prism"].update(memory_size=64, warmup_steps=0, memory_warmup_steps=0)
    raw["runtime"]["processes"] = 2
    raw["chains"] = {}
    raw["timing"]["noise"] = "clean"  # the timing section names a noise of the grid (its entries are empty)
    raw["figures"]["bspml_maps"] = {}
    env, out = dvc_repo(root, raw, targets=(STAGE,))
    return root, env, out


def _lock(root):
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]


def _mlflow_statuses(root, env) -> list[str]:
    code = (
        "import mlflow, json;"
        f"mlflow.set_tracking_uri('sqlite:///{root / 'mlflow.db'}');"
        "runs = mlflow.search_runs(experiment_names=['noisydml'], filter_string=\"tags.mlflow.runName = 'glyphs-clean-prism-0'\");"
        "print(json.dumps(sorted(runs['status'])))"
    )
    return json.loads(run_command([sys.executable, "-c", code], root, env).strip().splitlines()[-1])


def test_a_run_on_two_processes_through_the_stage_resumes_bit_exactly(repo):
    """``runtime.processes: 2``: the train stage relaunches itself under torchrun; rank 0 writes the run folder
    and the one MLflow run (rank 1 none); a run killed after epoch 1 resumes to the same outputs."""
    root, env, out = repo
    assert "runtime.processes = 2: " in out and "torch.distributed.run --standalone --nproc_per_node=2" in out
    run = root / "runs" / "glyphs" / "clean" / "prism" / "seed0"
    info = json.loads((run / "run.json").read_text())
    assert info["environment"]["gpu_settings"]["distributed"] == {"processes": 2, "backend": "gloo",
                                                                  "sync_batchnorm": False}
    assert len(pd.read_csv(run / "history.csv")) == 2
    assert _mlflow_statuses(root, env) == ["FINISHED"]
    whole = _lock(root)[STAGE]["outs"][0]["md5"]
    killed = subprocess.run([sys.executable, "-m", "dvc", "repro", "-f", "-s", STAGE], cwd=root,
                            env={**env, "NOISYDML_STOP_AFTER_EPOCH": "1"}, capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0 and "stopped after epoch 1" in killed.stdout + killed.stderr
    resumed = run_command([sys.executable, "-m", "dvc", "repro", "-f", "-s", STAGE], root, env)
    assert "after epoch 1 of 2" in resumed
    assert _lock(root)[STAGE]["outs"][0]["md5"] == whole
    # one MLflow run more: the killed run, resumed (one run); rank 1 made none
    assert _mlflow_statuses(root, env) == ["FINISHED", "FINISHED"]
