"""Which library's CPU code path changes which output: one switch at a time, native numerics.

    python scripts/numerics_knobs.py --workdir /tmp/knobs

Each switch below is what a different x86-64 host changes for one library (its dispatch level, or the thread
count). For each, the script runs five stages of a small version of the default pipeline in a fresh folder,
each from the same inputs, and prints whether the output is bit-identical to the one with no switch:

- pretrain: the embedded backbone's weights (``pretrain.epochs: 2``);
- corrupt sc50: small-cluster labels (pixel PCA by numpy/scikit-learn, k-means by faiss);
- train: ms, and prism (whose selection adds numpy and memory work), at sym50 for 3 epochs from the same
  pretrained weights and labels (their test embeddings);
- evaluate: the same run folder's retrieval metrics (faiss k-NN and k-means).

It then runs the same five under ``runtime.numerics: portable`` with every switch set at once: they are all
replaced, and the outputs equal the portable ones without switches. Takes about 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

SWITCHES = {
    "none": {},
    "ATen AVX2 -> default": {"ATEN_CPU_CAPABILITY": "default"},
    "oneDNN AVX2 -> AVX": {"ONEDNN_MAX_CPU_ISA": "AVX"},
    "MKL path -> AVX2 (portable's)": {"MKL_CBWR": "AVX2"},
    "MKL path -> AVX": {"MKL_CBWR": "AVX"},
    "MKL path -> compatible": {"MKL_CBWR": "COMPATIBLE"},
    "OpenBLAS -> Haswell (portable's)": {"OPENBLAS_CORETYPE": "Haswell"},
    "OpenBLAS -> Sandybridge": {"OPENBLAS_CORETYPE": "Sandybridge"},
    "faiss AVX2 -> none": {"FAISS_SIMD_LEVEL": "NONE"},
    "numpy without AVX2 loops": {"NPY_DISABLE_CPU_FEATURES": "X86_V3 AVX2 FMA3"},
    "threads 2 -> 1": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    "threads 2 -> 3": {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3"},
}
STEPS = ("pretrain", "corrupt sc50", "train ms sym50", "train prism sym50", "evaluate")


def _params(numerics: str, noises: tuple[str, ...] = ("sym50", "sc50")) -> dict:
    """The default params, small: 2 pretraining epochs, 3 training epochs, ms only, on ``noises``."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["runtime"].update(numerics=numerics, threads=0 if numerics == "native" else raw["runtime"]["threads"],
                          progress=False)
    raw["pretrain"]["epochs"] = 2
    raw["train"]["epochs"] = 3
    raw["grid"].update(noises=list(noises), methods=["ms", "prism"], seeds=[0], run_noises=[])
    raw["chains"] = {}
    raw["figures"]["bspml_maps"] = {}
    return raw


def _sha(path: Path) -> str:
    if path.is_dir():
        return hashlib.sha256(b"".join(_sha(p).encode() for p in sorted(path.rglob("*")) if p.is_file())).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stage(folder: Path, env: dict, *args: str) -> None:
    proc = subprocess.run([sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)} failed in {folder}:\n{proc.stderr[-3000:]}")


def _fresh(workdir: Path, name: str, base: Path, numerics: str, noises=("sym50", "sc50")) -> Path:
    folder = workdir / name
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(base, folder, symlinks=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(_params(numerics, noises), sort_keys=False))
    return folder


def outputs(workdir: Path, base: Path, label: str, env_add: dict, numerics: str) -> dict[str, str]:
    """The outputs under ``env_add``, each from ``base``'s inputs."""
    env = {**os.environ, **env_add, "PYTHONPATH": str(REPO / "src"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    slug = "".join(c if c.isalnum() else "_" for c in f"{numerics}_{label}")
    out = {}
    f = _fresh(workdir, f"{slug}_pretrain", base, numerics)
    shutil.rmtree(f / "data" / "pretrained")
    _stage(f, env, "stages/pretrain.py")
    out["pretrain"] = _sha(f / "data" / "pretrained" / "backbone.pt")
    f = _fresh(workdir, f"{slug}_corrupt", base, numerics)
    shutil.rmtree(f / "data" / "noisy" / "glyphs" / "sc50")
    _stage(f, env, "stages/corrupt.py", "--dataset", "glyphs", "--noise", "sc50")
    out["corrupt sc50"] = _sha(f / "data" / "noisy" / "glyphs" / "sc50")
    f = _fresh(workdir, f"{slug}_train", base, numerics)
    shutil.rmtree(f / "runs", ignore_errors=True)
    _stage(f, env, "stages/train.py", "--dataset", "glyphs", "--noise", "sym50", "--method", "ms", "--seed", "0")
    out["train ms sym50"] = _sha(f / "runs" / "glyphs" / "sym50" / "ms" / "seed0" / "test_embeddings.npz")
    _stage(f, env, "stages/train.py", "--dataset", "glyphs", "--noise", "sym50", "--method", "prism", "--seed", "0")
    out["train prism sym50"] = _sha(f / "runs" / "glyphs" / "sym50" / "prism" / "seed0" / "test_embeddings.npz")
    f = _fresh(workdir, f"{slug}_evaluate", base, numerics, noises=("sym50",))  # the runs trained in base
    _stage(f, env, "stages/evaluate.py", "--dataset", "glyphs")
    out["evaluate"] = _sha(f / "metrics" / "glyphs" / "sym50" / "ms" / "seed0.json")
    for name in ("pretrain", "corrupt", "train", "evaluate"):
        shutil.rmtree(workdir / f"{slug}_{name}")
    return out


def _base(workdir: Path) -> Path:
    """Inputs every measurement starts from: a copy of the code, prepared glyphs, pretrained weights, labels and
    two trained runs, made with native numerics and no switch."""
    base = workdir / "base"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    for name in ("stages", "references"):
        shutil.copytree(REPO / name, base / name)
    shutil.copy(REPO / "dvc.yaml", base / "dvc.yaml")
    (base / "params.yaml").write_text(yaml.safe_dump(_params("native"), sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    for args in (["stages/prepare.py", "--dataset", "glyphs"], ["stages/pretrain.py"],
                 ["stages/corrupt.py", "--dataset", "glyphs", "--noise", "sym50"],
                 ["stages/corrupt.py", "--dataset", "glyphs", "--noise", "sc50"],
                 ["stages/train.py", "--dataset", "glyphs", "--noise", "sym50", "--method", "ms", "--seed", "0"],
                 ["stages/train.py", "--dataset", "glyphs", "--noise", "sym50", "--method", "prism", "--seed", "0"]):
        _stage(base, env, *args)
    shutil.rmtree(base / ".checkpoints", ignore_errors=True)
    return base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    base = _base(args.workdir)
    rows = {label: outputs(args.workdir, base, label, env, "native") for label, env in SWITCHES.items()}
    every = {k: v for env in SWITCHES.values() for k, v in env.items() if k not in ("OMP_NUM_THREADS",)}
    every.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    portable = {"portable, no switch": outputs(args.workdir, base, "none", {}, "portable"),
                "portable, every switch at once": outputs(args.workdir, base, "all", every, "portable")}
    ref = rows["none"]
    print(f"native numerics (threads: the libraries' default, 2 here): is each output bit-identical to the one with "
          f"no switch?\n{'switch':<36}" + "".join(f"{s:>16}" for s in STEPS))
    for label, out in rows.items():
        print(f"{label:<36}" + "".join(f"{'same' if out[s] == ref[s] else 'DIFFERS':>16}" for s in STEPS))
    ref = portable["portable, no switch"]
    print(f"\nruntime.numerics: portable (threads 2):\n{'':<36}" + "".join(f"{s:>16}" for s in STEPS))
    for label, out in portable.items():
        print(f"{label:<36}" + "".join(f"{'same' if out[s] == ref[s] else 'DIFFERS':>16}" for s in STEPS))
    print("\nportable against native with no switch: " + ", ".join(
        f"{s} {'same' if ref[s] == rows['none'][s] else 'differs'}" for s in STEPS))
    (args.workdir / "knobs.json").write_text(json.dumps({"native": rows, "portable": portable}, indent=1))


if __name__ == "__main__":
    main()
