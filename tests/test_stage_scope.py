"""A change re-runs what it touches, and only that: each edit of the issue's table, made in a copy of this repository
whose grid instantiates every template of dvc.yaml, marks exactly the stages whose behaviour can change, as DVC
itself reports it (`dvc status`, after the digest stages have run: `code_digests`, what each stage script, method and
study runs, by meaning, and `chain_code`, a tuned chain's lineage; they train nothing).

The copy's dvc.lock is recorded by `dvc commit` over placeholder outputs (training would take minutes): what DVC
compares after an edit is the dependencies and params, which are real. scripts/stale_by_edit.py measures the same
table on the default grid.
"""

import shutil
import subprocess

import pytest
from dvc.repo import Repo
from dvc.utils.hydra import apply_overrides

from conftest import REPO, load_script
from noisydml.tools.rehearsal import run_checked, stage_env

pytestmark = pytest.mark.e2e

stale_by_edit = load_script("stale_by_edit")

#: Every template of dvc.yaml on, one item each where it can: one noise, the methods the default chains and BSPML's
#: maps train from (their chains at that noise kept), a run-sourced noise, one point of each figure, one tuned
#: method and one tuned chain, one timing entry.
EVERY_TEMPLATE = [
    "grid.noises=[sym50]", "grid.methods=[ms,prism,sgps,bspml,spa_confidence]",
    "~chains.smooth_proxy_anchor_clean", "~chains.smooth_proxy_anchor_sc50",
    # Proxy-Anchor's equal-budget control: its upstream (proxy_anchor_frozen) is not among the methods above
    "~chains.proxy_anchor_frozen_continued_clean", "~chains.proxy_anchor_frozen_continued_sym50",
    "~chains.proxy_anchor_frozen_continued_sc50",
    "grid.run_noises=[sc50_ms]",
    "+noise_runs.glyphs-sc50_ms={dataset: glyphs, noise: sc50_ms, run: {noise: sym50, method: ms, seed: 0}}",
    "figures.embedding_size.dims=[16]", "figures.embedding_size.methods=[bspml]",
    "figures.bspml_cells.lambdas=[3.0]", "figures.bspml_cells.mus=[20]", "figures.sgps_ablations.train=[both]",
    "tuning.noises=[sym50]", "tuning.methods=[prism]", "tuning.chains=[smooth_proxy_anchor]",
    "+timing.entries.ms={label: MS, method: ms, hparams: {}}",
]
#: File-like outputs (the rest are folders).
FILE_SUFFIXES = (".json", ".csv", ".png", ".pdf", ".md", ".tex")


def _placeholder(path):
    """A file or a folder with one file at ``path`` (an output or a dependency no stage writes here)."""
    if path.exists():
        return
    if path.suffix in FILE_SUFFIXES:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("placeholder\n")
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "placeholder").write_text("placeholder\n")


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A copy of the repository with every template on, its lock recorded by `dvc commit`; and its environment
    (its own package first on PYTHONPATH, so the code_digests stage digests the copy's code)."""
    root = tmp_path_factory.mktemp("scope") / "repo"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if name.startswith((".dvc/", "runs/", "metrics/", "reports/", "data/")) or not (REPO / name).is_file():
            continue
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    (root / "dvc.lock").unlink(missing_ok=True)
    apply_overrides(root / "params.yaml", EVERY_TEMPLATE)
    Repo.init(root, no_scm=True)
    env = {**stage_env(), "PYTHONPATH": str(root / "src")}
    run_checked(["dvc", "repro", "code_digests", "chain_code"], root, env)
    with Repo(root) as repo:
        stages = list(repo.index.stages)
        for stage in stages:
            for out in stage.outs:
                _placeholder(root / str(out.def_path))
        for stage in stages:
            for dep in stage.deps:
                if not str(dep.def_path).startswith(("src/", "stages/")):
                    _placeholder(root / str(dep.def_path))
        names = sorted(s.name for s in stages)
    run_checked(["dvc", "commit", "--force", "--quiet"], root, env)
    assert subprocess.run(["dvc", "status", "--quiet"], cwd=root, env=env).returncode == 0
    templates = {name.split("@")[0] for name in names}
    assert templates >= {"download", "prepare", "pretrain", "corrupt", "corrupt_from_run", "code_digests", "chain_code",
                         "train",
                         "train_on_run_noise", "train_embedding_size", "train_bspml_cell", "train_sgps_ablation",
                         "evaluate", "train_chain", "tune", "train_tuned", "tune_chain", "train_tuned_chain", "timing",
                         "bspml_maps", "report"}, templates
    return root, env, names


def _stale(committed, tmp_path, label):
    root, env, names = committed
    copy = tmp_path / "repo"
    shutil.copytree(root, copy, symlinks=True)
    edit = dict(stale_by_edit.EDITS)[label]
    stale = stale_by_edit.stale_after(copy, edit, env={**env, "PYTHONPATH": str(copy / "src")}, names=names)
    return set(stale), names


def test_comments_and_docstrings_everywhere_re_run_nothing(committed, tmp_path):
    """Every source file and stage script at once (each file's digest is its own: none alone re-runs anything)."""
    stale, _ = _stale(committed, tmp_path, "comments and docstrings in every source file and stage script")
    assert stale == set()


def test_a_change_in_tuning_re_runs_the_tune_stages_and_the_tuned_runs_only(committed, tmp_path):
    stale, names = _stale(committed, tmp_path, "a change in tuning.py")
    assert stale == {n for n in names if n.split("@")[0] in ("tune", "tune_chain", "train_tuned", "train_tuned_chain")}


def test_a_change_in_sgps_parts_re_runs_the_sgps_family_only(committed, tmp_path):
    """The SGPS runs (grid, run-sourced noise, its ablation, the chains that train sgps: the posterior data clean's
    stage 3 and its equal-budget control); not PRISM (whose parts SGPS imports, not the other way), not evaluate (it
    re-runs when a run's folder changes: what depends on them)."""
    stale, names = _stale(committed, tmp_path, "a change in SGPS's parts file")
    assert stale == {"train@glyphs-sym50-sgps-0", "train_on_run_noise@glyphs-sc50_ms-sgps-0",
                     "train_sgps_ablation@both-0", "train_chain@sgps_posterior", "train_chain@sgps_from_prism"}


def test_a_new_pml_method_re_runs_nothing(committed, tmp_path):
    stale, _ = _stale(committed, tmp_path, "a new method over a PML loss (grid.methods unchanged)")
    assert stale == set()


def test_a_new_study_with_runs_re_runs_evaluate_and_the_report_only(committed, tmp_path):
    """A study with runs is its module, its stage template in dvc.yaml and its params section: no grid, chained or
    other study's run re-trains; its own run is new."""
    stale, _ = _stale(committed, tmp_path, "a new study with runs (module, stage template, params section)")
    assert stale == {"evaluate@glyphs", "report", "train_another_ablation@both-0"}


def test_a_new_benchmark_re_runs_no_training(committed, tmp_path):
    """A benchmark is a module in data/kinds and its params entry: no dataset's download or prepare (each runs its
    own kind's module, by name), only the report (it reads the datasets section for the names of datasets)."""
    stale, _ = _stale(committed, tmp_path, "a new benchmark (a module in data/kinds, its params entry)")
    assert stale == {"report"}


def test_a_change_in_one_dataset_kind_re_runs_that_kinds_stages_only(committed, tmp_path):
    """The glyph renderer: the glyphs dataset's download and prepare, and the pretraining (its source set is
    glyphs); no training stage directly (they re-run when the prepared data changes: what depends on them)."""
    stale, _ = _stale(committed, tmp_path, "a change in the grid's dataset kind (data/glyphs.py)")
    assert stale == {"download@glyphs", "prepare@glyphs", "pretrain"}


def test_a_change_in_another_dataset_kind_re_runs_nothing_of_this_grid_but_the_pretraining(committed, tmp_path):
    """data/faces.py: no glyphs stage, but the pretrain stage, whose code holds every source set it can pretrain on
    (pretrain.source: glyphs, motifs or faces' source identities)."""
    stale, _ = _stale(committed, tmp_path, "a change in another dataset kind (data/faces.py)")
    assert stale == {"pretrain"}


def test_a_change_in_face_verification_re_runs_no_retrieval_training(committed, tmp_path):
    """Face verification is the faces kind's step after training (its code/training unit): a glyphs grid re-trains
    nothing; evaluate scores verification, so it re-runs."""
    stale, _ = _stale(committed, tmp_path, "a change in face verification (pipeline/face_features.py)")
    assert stale == {"evaluate@glyphs"}


def test_a_change_in_one_sections_schema_re_runs_the_stages_that_load_it(committed, tmp_path):
    """noise_runs is loaded by the corrupt stages (the run-sourced noise's too), the label audit and the report."""
    stale, names = _stale(committed, tmp_path, "a change in one section's schema (sections/noise_runs.py)")
    assert stale == {n for n in names if n.split("@")[0] in ("corrupt", "corrupt_from_run", "audit")} | {"report"}


def test_a_cross_section_rule_re_runs_nothing(committed, tmp_path):
    stale, _ = _stale(committed, tmp_path, "a change in tools/check.py")
    assert stale == set()


def test_a_change_in_the_figures_re_runs_the_report_only(committed, tmp_path):
    stale, _ = _stale(committed, tmp_path, "a change in reporting/figures.py")
    assert stale == {"report"}


TRAINING = ("train", "train_on_run_noise", "train_embedding_size", "train_bspml_cell", "train_sgps_ablation",
            "train_chain", "tune", "train_tuned", "tune_chain", "train_tuned_chain", "timing")


def test_amp_re_runs_every_training_stage_and_nothing_else(committed, tmp_path):
    stale, names = _stale(committed, tmp_path, "runtime.amp: bfloat16")
    assert stale == {n for n in names if n.split("@")[0] in TRAINING}


def test_a_change_in_the_trainer_loop_re_runs_every_training_stage_and_nothing_else(committed, tmp_path):
    stale, names = _stale(committed, tmp_path, "a change in the trainer loop (engine/trainer.py)")
    assert stale == {n for n in names if n.split("@")[0] in TRAINING}
