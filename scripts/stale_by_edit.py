"""Which DVC stages one edit makes stale, measured with DVC itself (``dvc status``) in a fresh clone.

    python scripts/stale_by_edit.py                 # the default grid: every edit of EDITS, one table
    python scripts/stale_by_edit.py --list          # also the stale stages' names
    python scripts/stale_by_edit.py --repo PATH     # another checkout (e.g. an older commit's clone)

For each edit: clone the repository (its committed state) into a temporary folder, run ``dvc status --json``,
make the edit, run the digest stages where dvc.yaml has them (``code_digests``: what each stage script, method and
study runs, by meaning; ``chain_code``: a tuned chain's lineage; ``method_code`` in older commits; they decide which
stages see an edit, and train nothing), then ``dvc status --json`` again. A stage counts as stale when the edit added an entry to its status: a dependency or a params key
changed. Comparing with the status before the edit leaves out what a clone lacks anyway (outputs that are not in
git are reported as deleted in both).

The edits are the table of docs/extending.md (tests/test_stage_scope.py asserts the same on a grid with every
template on). "A change" appends a module-level assignment: what any change of behaviour does to a file's digest.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from dvc.utils.serialize import modify_yaml

from noisydml.pipeline.code_digests import DIGEST_STAGES as CURRENT_DIGEST_STAGES

REPO = Path(__file__).resolve().parents[1]
#: The stages that digest what a stage runs (dvc.yaml: code units, a tuned chain's lineage; ``method_code`` in older
#: commits); they train nothing, and are run before the status is read.
DIGEST_STAGES = (*CURRENT_DIGEST_STAGES, "method_code")
#: A change of behaviour (a new module-level name): a comment or a docstring changes no digest.
A_CHANGE = "\n_A_CHANGE = 1\n"

NEW_PML_METHOD = '''"""``lifted``: a pytorch-metric-learning baseline added by the stale-stages measurement (not a real method)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(losses.GeneralizedLiftedStructureLoss, {"neg_margin": 1.0, "pos_margin": 0.0},
                                 "generalised lifted structure loss (Hermans et al. 2017)"))
'''


def _append(path: str, text: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        with open(root / path, "a") as f:
            f.write(text)
    return edit


def _new_pml_method(root: Path) -> None:
    """The route docs/extending.md gives: a method file and its params entry, grid.methods unchanged."""
    (root / "src/noisydml/methods/lifted.py").write_text(NEW_PML_METHOD)
    params = root / "params.yaml"
    text = params.read_text()
    anchor = "\nmethods:\n"
    assert anchor in text, "params.yaml has no top-level methods section"
    params.write_text(text.replace(anchor, anchor + "  lifted:\n    loss: {neg_margin: 1.0, pos_margin: 0.0}\n"
                                   "    lr_multiplier: 1.0\n", 1))


def _new_study_with_runs(root: Path) -> None:
    """The route docs/extending.md gives for a study with runs of its own: its module, its stage template in
    dvc.yaml, its params section (here SGPS's, renamed: what DVC sees is the same)."""
    studies = root / "src/noisydml/studies"
    (studies / "another.py").write_text((studies / "sgps.py").read_text().replace("sgps_ablation", "another_ablation")
                                        .replace('name="sgps"', 'name="another"'))
    dvc_yaml = root / "dvc.yaml"
    text = dvc_yaml.read_text()
    start = text.index("  train_sgps_ablation:")
    block = text[start:text.index("\n\n", start)]
    new = (block.replace("sgps_ablation", "another_ablation").replace("--study sgps", "--study another")
           .replace("code/studies/sgps.json", "code/studies/another.json").replace("/sgps_${", "/another_${"))
    dvc_yaml.write_text(text.replace(block, block + "\n\n" + new, 1))
    with modify_yaml(root / "params.yaml") as params:  # DVC's own round trip: the other keys as written
        params["figures"]["another_ablations"] = copy.deepcopy(params["figures"]["sgps_ablations"])


def _new_benchmark(root: Path) -> None:
    """The route docs/extending.md gives for a benchmark: a module in data/kinds (here CUB's benchmark under
    another kind name) and its params entry, no grid naming it."""
    (root / "src/noisydml/data/kinds/cub200_copy.py").write_text(
        '"""A copy of cub200."""\n\nfrom noisydml.data.benchmarks import benchmark_kind\n'
        'from noisydml.data.kinds.cub200 import BENCHMARK\n\nKIND = benchmark_kind("cub200_copy", BENCHMARK)\n')
    with modify_yaml(root / "params.yaml") as params:
        params["datasets"]["cub_copy"] = {**copy.deepcopy(params["datasets"]["cub"]), "kind": "cub200_copy"}


def _set_param(section: str, key: str, value: str) -> Callable[[Path], None]:
    """Set ``section.key`` (a key of a top-level section, written on one line) in params.yaml, keeping its comment."""
    def edit(root: Path) -> None:
        params = root / "params.yaml"
        lines = params.read_text().splitlines(keepends=True)
        inside = False
        for i, line in enumerate(lines):
            if line.startswith(f"{section}:"):
                inside = True
            elif inside and line.startswith(f"  {key}:"):
                comment = line.split("#", 1)[1] if "#" in line else "\n"
                lines[i] = f"  {key}: {value}  #{comment}" if "#" in line else f"  {key}: {value}\n"
                break
            elif inside and line.strip() and not line.startswith((" ", "#")):
                raise SystemExit(f"params.yaml: {section}.{key} not found")
        params.write_text("".join(lines))
    return edit


def _comment_everywhere(root: Path) -> None:
    """A comment, a blank line and a reworded module docstring in every source file and stage script."""
    for path in sorted((root / "src" / "noisydml").rglob("*.py")) + sorted((root / "stages").glob("*.py")):
        text = path.read_text()
        for quote in ('"""', "'''"):
            if text.startswith(quote):
                text = quote + "Reworded. " + text[len(quote):]
                break
        path.write_text(text + "\n# a comment\n\n")


#: The edits: (label, edit of a clone's working tree).
EDITS: list[tuple[str, Callable[[Path], None]]] = [
    ("comments and docstrings in every source file and stage script", _comment_everywhere),
    ("a change in tuning.py", _append("src/noisydml/tuning.py", A_CHANGE)),
    ("a change in SGPS's parts file", _append("src/noisydml/methods/parts/sgps.py", A_CHANGE)),
    ("a new method over a PML loss (grid.methods unchanged)", _new_pml_method),
    ("a new study with runs (module, stage template, params section)", _new_study_with_runs),
    ("a new benchmark (a module in data/kinds, its params entry)", _new_benchmark),
    ("a change in tools/check.py", _append("src/noisydml/tools/check.py", A_CHANGE)),
    ("a change in reporting/figures.py", _append("src/noisydml/reporting/figures.py", A_CHANGE)),
    ("a change in the trainer loop (engine/trainer.py)", _append("src/noisydml/engine/trainer.py", A_CHANGE)),
    ("a change in the grid's dataset kind (data/glyphs.py)", _append("src/noisydml/data/glyphs.py", A_CHANGE)),
    ("a change in another dataset kind (data/faces.py)", _append("src/noisydml/data/faces.py", A_CHANGE)),
    ("a change in face verification (pipeline/face_features.py)",
     _append("src/noisydml/pipeline/face_features.py", A_CHANGE)),
    ("a change in the report section's schema (pipeline/report_params.py)",
     _append("src/noisydml/pipeline/report_params.py", A_CHANGE)),
    ("a change in one section's schema (sections/noise_runs.py)",
     _append("src/noisydml/sections/noise_runs.py", A_CHANGE)),
    ("a change in the train section's schema (sections/train.py)", _append("src/noisydml/sections/train.py", A_CHANGE)),
    ("a change in the params loader (config.py)", _append("src/noisydml/config.py", A_CHANGE)),
    ("evaluate.max_k: 1000", _set_param("evaluate", "max_k", "1000")),
    ("runtime.amp: bfloat16", _set_param("runtime", "amp", "bfloat16")),
]


def dvc(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """DVC in ``root``; its stages run this interpreter and the package of ``root`` (``env``: the environment to
    start from)."""
    exe = Path(sys.executable).parent / "dvc"
    env = {**(env or os.environ), "DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(root / "src"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{(env or os.environ).get('PATH', '')}"}
    return subprocess.run([str(exe) if exe.exists() else "dvc", *args], cwd=root, capture_output=True, text=True,
                          env=env)


def status_entries(root: Path, env: dict | None = None) -> dict[str, set[str]]:
    """``dvc status --json`` as stage -> its status entries, each a string (kind + path or key)."""
    proc = dvc(root, "status", "--json", env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc status failed in {root}:\n{proc.stderr[-2000:]}")
    out: dict[str, set[str]] = {}
    for stage, entries in json.loads(proc.stdout or "{}").items():
        flat = set()
        for entry in entries:
            if isinstance(entry, str):
                flat.add(entry)
                continue
            for kind, changes in entry.items():
                if isinstance(changes, dict):
                    flat.update(f"{kind}: {path} {what}" for path, what in changes.items())
                else:
                    flat.add(f"{kind}: {changes}")
        out[stage] = flat
    return out


def stale_after(root: Path, edit: Callable[[Path], None], env: dict | None = None,
                names: list[str] | None = None) -> list[str]:
    """The stages ``edit`` makes stale in ``root`` (a checkout with a dvc.lock), by dvc status before and after;
    ``names``: the stages of ``root``, where its status is known to be clean before the edit (then not read)."""
    before = status_entries(root, env) if names is None else {}
    edit(root)
    names = names or dvc(root, "stage", "list", "--name-only", env=env).stdout.split()
    digests = [name for name in names if name.split("@")[0] in DIGEST_STAGES]
    if digests:
        proc = dvc(root, "repro", "--single-item", *digests, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"dvc repro {' '.join(digests)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    after = status_entries(root, env)
    return sorted(s for s, entries in after.items()
                  if s.split("@")[0] not in DIGEST_STAGES and entries - before.get(s, set()))


def clone(source: Path, into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(source), str(into)], check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the repository to clone (default: this one)")
    parser.add_argument("--list", action="store_true", help="print the stale stages' names too")
    args = parser.parse_args(argv)
    total = len(dvc(clone(args.repo, Path(tempfile.mkdtemp()) / "r"), "stage", "list", "--name-only").stdout.split())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.repo, capture_output=True, text=True)
    print(f"{args.repo} ({commit.stdout.strip()}): {total} stages\n")
    print("| edit | stale stages |\n|---|---|")
    for label, edit in EDITS:
        tmp = Path(tempfile.mkdtemp())
        try:
            stale = stale_after(clone(args.repo, tmp / "r"), edit)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        groups = sorted({s.split("@")[0] for s in stale})
        print(f"| {label} | {len(stale)} ({', '.join(groups) or 'none'}) |")
        if args.list:
            print("|  | " + " ".join(stale) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
