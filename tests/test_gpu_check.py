"""scripts/gpu_check.py, the check a GPU machine runs in one call (docs/gpu.md), kept from rotting: every section
at toy sizes on the CPU, with DVC, MLflow, Ray and Optuna made unimportable as on the GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Imported first by every Python process started with it on PYTHONPATH (the check's stages too): the packages
#: the GPU machine lacks and the training path must not need.
BLOCKER = '''
import importlib.abc, sys

class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dvc", "mlflow", "ray", "optuna"):
            raise ImportError(f"No module named {name!r} (blocked: the GPU machine has none)")
        return None

sys.meta_path.insert(0, _Missing())
'''


def test_the_gpu_check_runs_every_section_on_the_cpu_without_dvc_mlflow_or_ray(tmp_path):
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "blocker"), "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--toy", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    sections = report["sections"]
    assert set(sections) == {"environment", "train_stage", "knn", "backbones", "methods", "decode", "ddp"}
    assert not report["skipped"] and not [name for name, s in sections.items() if "error" in s]
    env_section = sections["environment"]
    assert env_section["packages"]["mlflow"].startswith("missing") and env_section["packages"]["dvc"].startswith("missing")
    assert env_section["torch_pinned_by_project"] and env_section["torch"]
    # the train stage ran as a plain process on the CPU and recorded where
    run = sections["train_stage"]["runs"]["cpu"]
    assert run["environment_recorded"]["device"] == "cpu" and 0 <= run["metrics"]["precision_at_1"] <= 1
    # the torch search found faiss's neighbours on random vectors
    assert sections["knn"]["rows_with_identical_neighbours"] == 1.0 and sections["knn"]["max_metric_difference"] == 0
    assert {r["method"] for r in sections["methods"]["rows"]} == {"mcl", "prism", "sgps_bank", "sgps_forward",
                                                                  "bspml"}
    forward = next(r for r in sections["methods"]["rows"] if r["method"] == "sgps_forward")
    assert forward["images_per_step"] == 5 * forward["batch"]  # the batch and 4 forwarded positives per item
    assert all(sections["ddp"][k] is True for k in ("gather_rows", "average_gradients", "broadcast_buffers",
                                                  "gather_shards", "ddp_gradients_equal_across_ranks"))
    assert "| method | amp |" in done.stdout  # the table for the note


def test_the_gpu_check_help_is_the_one_call_recipe():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for part in ("--fetch-wheels .whl", 'carry: [".whl"]', "timeout_s: 420", "--target /tmp/site", "give_back"):
        assert part in done.stdout, part
