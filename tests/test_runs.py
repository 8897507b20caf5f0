"""Runs are values (noisydml.runs): every run params.yaml asks for is one train stage of dvc.yaml, whose `--run-folder` and
output are the run's folder and whose name is the run's stage -- checked through DVC's own resolution of dvc.yaml,
with every kind of run switched on."""

import functools
import shutil

import pytest
from dvc.repo import Repo
from dvc.utils.hydra import apply_overrides

from noisydml.config import load_params
from noisydml.studies import all_runs as runs_of  # the grid's, the chains' and every study's own runs

from conftest import REPO

EVERY_KIND = ["grid.noises=[clean,sym50,sc50,sympc20]", "grid.seeds=[0,1]", "grid.run_noises=[sc50_ms]",
              "+noise_runs.glyphs-sc50_ms={dataset: glyphs, noise: sc50_ms, run: {noise: clean, method: ms, seed: 0}}",
              "figures.embedding_size.dims=[16,32]", "figures.bspml_cells.lambdas=[2.7,3.0]",
              "figures.bspml_cells.mus=[0.0,20]", "figures.sgps_ablations.train=[both,tau_1]",
              "figures.sgps_ablations.seeds=[0,1]", "tuning.noises=[sym50]", "tuning.methods=[prism]",
              "tuning.chains=[smooth_proxy_anchor]"]


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """(params, {stage name: (cmd, outs)}, {stage name: deps}) of dvc.yaml as DVC resolves it with every kind of run
    on."""
    root = tmp_path_factory.mktemp("runs")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, root / name)
    apply_overrides(root / "params.yaml", EVERY_KIND)
    Repo.init(root, no_scm=True)
    with Repo(root) as repo:
        stages = {s.name: (s.cmd, [str(o.def_path) for o in s.outs]) for s in repo.index.stages}
        deps = {s.name: [str(d.def_path) for d in s.deps] for s in repo.index.stages}
    from noisydml.tools.check import check_all

    return check_all(load_params(root / "params.yaml")), stages, deps


def test_every_run_is_the_train_stage_dvc_resolves_for_it(resolved):
    params, stages, _ = resolved
    runs = runs_of(params)
    assert {r.kind.name for r in runs} == {"grid", "chain", "tuned", "embedding_size", "bspml_cell", "sgps_ablation"}
    for run in runs:
        assert run.stage in stages, run.stage
        cmd, outs = stages[run.stage]
        # a grid or study run: its seed folder; a chained run (tuned or not): the chain's folder holding its seeds
        folder = run.folder if run.chain is None else run.folder.rsplit("/", 1)[0]
        assert outs == [folder] and cmd.split("--run-folder ")[1].split()[0] == folder, (run.stage, cmd, outs)
    trained_by_dvc = {name for name, (cmd, _) in stages.items() if "stages/train.py" in cmd or
                      "stages/train_tuned.py" in cmd}
    # a tuned run trains through its own script (the only one that runs the tuning code), the others through train.py
    assert all(("stages/train_tuned.py" in stages[r.stage][0]) == (r.kind.name == "tuned") for r in runs)
    assert trained_by_dvc == {r.stage for r in runs}
    # a chain trains at every grid seed unless it names its seeds, in one stage
    chained = [r for r in runs if r.stage == "train_chain@sgps_posterior"]
    assert [r.seed for r in chained] == [0, 1] and {r.folder for r in chained} == {
        "runs/glyphs/sym50/sgps_posterior/seed0", "runs/glyphs/sym50/sgps_posterior/seed1"}
    # a tuned chain: the chain's entry, its seeds, the values its own study chose
    tuned = [r for r in runs if r.stage == "train_tuned_chain@glyphs-sym50-smooth_proxy_anchor"]
    assert [r.seed for r in tuned] == [0, 1] and {r.chain["key"] for r in tuned} == {"smooth_proxy_anchor_sym50"}
    assert {r.chosen for r in tuned} == {"tuning/glyphs/sym50/smooth_proxy_anchor/chosen.json"}


def test_a_chains_upstream_folder_is_a_dvc_edge_to_every_seed_of_it(resolved, tmp_path):
    """The chain stage depends on runs/<dataset>/<noise>/<upstream>/: DVC links it to each seed's stage of a grid
    upstream (the folder holds their outputs) and to a chained upstream's stage."""
    root = tmp_path
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, root / name)
    apply_overrides(root / "params.yaml", ["grid.seeds=[0,1]"])
    Repo.init(root, no_scm=True)
    with Repo(root) as repo:
        graph = repo.index.graph
        by_name = {s.name: s for s in repo.index.stages}
        upstreams = {name: sorted(s.name for s in graph.successors(by_name[name]))
                     for name in ("train_chain@ms_on_prism_kept", "train_chain@sgps_posterior")}
    assert "train@glyphs-sym50-prism-0" in upstreams["train_chain@ms_on_prism_kept"]
    assert "train@glyphs-sym50-prism-1" in upstreams["train_chain@ms_on_prism_kept"]
    assert "train_chain@sgps_posterior_stage2" in upstreams["train_chain@sgps_posterior"]


def test_a_runs_overrides_are_the_only_difference_from_params(resolved):
    params, _, _ = resolved
    cell = next(r for r in runs_of(params) if r.kind.name == "bspml_cell" and r.point == {"lambda": 3.0, "mu": 20})
    trained = cell.params(params)
    assert trained["methods"]["bspml"] == {**params["methods"]["bspml"], "lambda_0": 3.0, "lambda_inf": 3.0,
                                           "age_multiplier": 1.0, "mu": 20, "age_unit": "absolute"}
    assert trained["train"] == params["train"] and cell.folder == "runs/glyphs/sympc20/bspml_lam3.0_mu20/seed0"
    variant = next(r for r in runs_of(params) if r.kind.name == "sgps_ablation")
    # a nested section of the overrides is merged key by key
    assert variant.params({**params, "figures": params["figures"]})["methods"]["sgps"]["sgm"] == \
        params["methods"]["sgps"]["sgm"]
    chain = next(r for r in runs_of(params) if r.stage == "train_chain@sgps_posterior_stage2")
    assert chain.params(params)["train"]["model_selection"] == "best_validation"
    assert chain.params(params)["methods"]["prism"]["noise_rate"] == 0.2


@functools.cache
def _unit_files() -> dict[str, set]:
    """Every code unit (``code/<kind>/<name>.json``) -> its files, as the code_digests stage finds them (each file's
    imports read once for all units)."""
    from noisydml.pipeline.code_digests import KINDS, closures, unit_names, unit_roots

    return closures({f"code/{kind}/{name}.json": unit_roots(kind, name, REPO / "stages")
                     for kind in KINDS for name in unit_names(kind, REPO / "stages")})


def _reached_by(stage_deps: dict[str, list[str]], path: str) -> set[str]:
    """The kinds of stage a change of the package file ``path`` (``noisydml/...``) makes stale: those with a code
    unit holding it (code/<kind>/<name>.json, as the code_digests stage writes it), or the folder of such a unit,
    among their deps; a file no unit holds yet (a new study) reaches the stages with its unit's folder."""
    file = (REPO / "src" / path).resolve()
    units = {unit for unit, files in _unit_files().items() if file in files}
    if path.startswith("noisydml/studies/") and not file.exists():
        units.add(f"code/studies/{file.stem}.json")
    return {name.split("@")[0] for name, deps in stage_deps.items()
            if any(unit == d or unit.startswith(d + "/") for unit in units for d in deps)}


@pytest.mark.parametrize("study, own_kinds", [("bspml", {"train_embedding_size", "train_bspml_cell", "bspml_maps"}),
                                               ("sgps", {"train_sgps_ablation"}), ("prism", set()),
                                               ("smooth_proxy_anchor", set())])
def test_a_study_reaches_its_own_runs_evaluate_and_report_only(resolved, study, own_kinds):
    """A change of a study's module re-runs its own stages, evaluate and report; never a grid or chained run. Adding
    a study (a new file in the studies folder) reaches the stages with the folder of study units among their deps:
    evaluate, report."""
    _, _, deps = resolved
    assert _reached_by(deps, f"noisydml/studies/{study}.py") == own_kinds | {"evaluate", "report"}
    assert _reached_by(deps, "noisydml/studies/a_new_paper.py") == {"evaluate", "report"}
    assert _reached_by(deps, "noisydml/reporting/tables.py") == {"report"}
