"""Paper profiles: each is applied by DVC's own override code and validates, its run count is what its grid and
chains train, every setting that changes a result says where it comes from, the README prints the generated
tables, and its command sets exactly its overrides."""

import shlex

import pytest

from noisydml.tools.profiles import (PROFILES_PAGE, SETTINGS_BEGIN, SETTINGS_END, exp_command, load_profiles, params_after,
                                        profiles_table, readme_with_settings, settings_tables)
from noisydml.runs import runs_of
from noisydml.schema import ParamsError

from conftest import REPO

PROFILES = load_profiles(REPO / "profiles")


@pytest.fixture(scope="module")
def applied():
    """Each profile's params after DVC applies its overrides (DVC's apply_overrides on a copy; a few seconds)."""
    return {name: params_after(p["set"], REPO / "params.yaml") for name, p in PROFILES.items()}


def test_every_paper_has_profiles():
    papers = {name.split("/")[0] for name in PROFILES}
    assert papers == {"prism", "sgps", "bspml"}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_validates_and_counts_its_runs(name, applied):
    params = applied[name]
    assert PROFILES[name]["runs"] == len(runs_of(params))
    # published weights (fetched and checked), or from scratch where the paper trains so (faces: SGPS Table IV)
    assert params["train"]["pretrained"] in params["weights"] or params["train"]["pretrained"] == "none"
    assert all(c["dataset"] in params["grid"]["datasets"] for c in params["chains"].values())


def test_sgps_table_one_trains_its_sgps_mcl_row_the_posterior_chain(applied):
    for name in ("sgps/table1_cub", "sgps/table1_sop"):
        params = applied[name]
        chained = {(c["noise"], c["name"]) for c in params["chains"].values()}
        assert chained == {(n, stage) for n in params["grid"]["noises"]
                           for stage in ("sgps_posterior_stage2", "sgps_posterior")}
        assert params["methods"]["sgps"]["temperature"] == 0.02 and params["methods"]["sgps"]["positives"] == "both"


def test_authors_settings_reach_the_params(applied):
    prism = applied["prism/table1_sop"]["methods"]
    assert prism["prism"]["reduction"] == prism["mcl"]["reduction"] == "sum_over_batch"
    assert prism["prism"]["fallback_window"] == "reset"
    assert prism["softtriple"]["loss"]["centers_per_class"] == 2  # the authors' rule at >= 500 classes
    sgps = applied["sgps/table3_food101n"]
    assert sgps["methods"]["sgps"]["sgm"]["tau_k_factor"] == 2.0  # real noise (SGPS IV-C)
    assert sgps["train"]["optimizer"]["betas"] == [0.9, 0.95] and sgps["train"]["optimizer"]["grad_clip_norm"] == 1.0
    assert 128 in applied["bspml/table1_inshop_sop"]["evaluate"]["recall_at"]


def test_readme_prints_the_generated_profile_and_settings_tables(applied):
    readme = (REPO / PROFILES_PAGE).read_text()
    from noisydml.config import load_params
    from noisydml.tools.check import check_all
    from noisydml.tools.profiles import settings_page

    text = settings_page(PROFILES, applied, check_all(load_params(REPO / "params.yaml")))
    assert readme_with_settings(readme, text) == readme, \
        f"{PROFILES_PAGE}'s profile tables are stale: noisydml profile settings --write"
    assert readme.count(SETTINGS_BEGIN) == readme.count(SETTINGS_END) == 1


def test_a_setting_that_changes_results_must_say_where_it_comes_from(tmp_path):
    (tmp_path / "x.yaml").write_text("profiles:\n  t: {table: T, runs: 1, set: ['train.epochs=3']}\n")
    with pytest.raises(ParamsError, match="changes what is computed"):
        load_profiles(tmp_path)
    (tmp_path / "x.yaml").write_text("profiles:\n  t: {table: T, runs: 1, set: [{set: 'train.epochs=3', paper: x}]}\n")
    with pytest.raises(ParamsError, match="exactly the string keys set, paper, authors, why"):
        load_profiles(tmp_path)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_command_sets_exactly_the_overrides(name):
    words = shlex.split(exp_command(name, PROFILES[name]).replace("\\\n", " "))
    assert words[:4] == ["dvc", "exp", "run", "-n"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "-S"] == PROFILES[name]["set"]


def test_an_override_dvc_refuses_is_an_error():
    with pytest.raises(ParamsError, match="DVC refuses"):
        params_after(["nothing.here=1"], REPO / "params.yaml")


@pytest.mark.parametrize("name", sorted(n for n in PROFILES if n.startswith("sgps/") and "table4" not in n))
def test_each_sgps_profiles_lr_never_rises_after_its_minimum(name, applied):
    """The retrieval tables (Table IV's face runs follow the paper's steps): the authors' warm-up/hold/cosine
    fitted to each run's length (train.schedule warmup_hold_cosine_fitted): at
    the full datasets' sizes, the lr peaks once, then never rises, and reaches 0 at the run's last step."""
    import numpy as np

    from noisydml.engine.optim import lr_factor
    from noisydml.engine.sampling import steps_per_epoch
    from noisydml.tools.profiles import _images

    params = applied[name]
    train = params["train"]
    assert train["schedule"]["name"] == "warmup_hold_cosine_fitted"
    assert train["schedule"]["warmup_start_factor"] == 1e-6  # torch's LinearLR start_factor, a factor
    for dataset in params["grid"]["datasets"]:
        steps = steps_per_epoch(_images(params, dataset)[0], train["batch"]["classes"] * train["batch"]["per_class"])
        factor = lr_factor(train["schedule"], train["epochs"], steps)
        curve = np.array([factor(step) for step in range(train["epochs"] * steps)])
        low, peak = int(np.argmin(curve[1:])) + 1, int(np.argmax(curve))
        assert low == len(curve) - 1 and curve[low] < 1e-6, (dataset, low, len(curve))
        assert np.all(np.diff(curve[peak:]) <= 1e-12), dataset
    for method in ("sgps", "sgps_supcon", "sgps_roadmap", "sgps_contextual"):
        assert params["methods"][method]["sgm"]["start_epoch"] == 0  # NOISE.WARM_UP: 0


def test_a_method_setting_per_noise_goes_through_dvc_and_is_validated():
    """methods.<m>.per_noise: a grid's runs of one method take their setting from their noise column (Co-teaching's
    forget rate = the noise rate), through DVC's own override code; a bad value or an unknown noise is refused."""
    overrides = ["+methods.coteaching.per_noise={sym50: {forget_rate: 0.45}, sc50: {forget_rate: 0.3}}",
                 "grid.methods=[coteaching, ms, bspml]", "~chains", "+chains={}"]
    params = params_after(overrides, REPO / "params.yaml")
    rates = {run.noise: run.params(params)["methods"]["coteaching"]["forget_rate"]
             for run in runs_of(params) if run.method == "coteaching"}
    default = params["methods"]["coteaching"]["forget_rate"]
    assert rates == {"clean": default, "sym50": 0.45, "sc50": 0.3}
    assert all("per_noise" not in run.params(params)["methods"][run.method] for run in runs_of(params))
    with pytest.raises(ParamsError, match=r"methods.coteaching.per_noise.sym20.forget_rate"):
        params_after(["+methods.coteaching.per_noise={sym20: {forget_rate: 2.0}}"], REPO / "params.yaml")
    with pytest.raises(ParamsError, match=r"methods.coteaching.per_noise: unknown noise setting 'nosuch'"):
        params_after(["+methods.coteaching.per_noise={nosuch: {forget_rate: 0.2}}"], REPO / "params.yaml")


def test_the_paper_profiles_train_each_cell_under_its_papers_settings(applied):
    """A profile tags its runs with its paper (report.settings_of); the cells SGPS reprints from PRISM are trained
    by the PRISM profiles (with the classification baselines), never by SGPS's."""
    from noisydml.reporting.references import load_references

    refs = load_references(REPO / "references" / "papers")
    for name, params in applied.items():
        assert params["report"]["settings_of"] == name.split("/")[0]
    reprinted = refs[(refs["paper"] == "SGPS") & (refs["settings_of"] == "prism") & (refs["table"] == "Table III")]
    for dataset, profile in (("cars98n", "table3_cars98n"), ("food101n", "table3_food101n")):
        methods = set(reprinted.loc[reprinted["dataset"] == dataset, "method"])
        assert methods <= set(applied[f"prism/{profile}"]["grid"]["methods"])
        assert not methods & set(applied[f"sgps/{profile}"]["grid"]["methods"])
    prism = applied["prism/table1_cub"]
    rates = {run.noise: run.params(prism)["methods"]["coteaching"]["forget_rate"]
             for run in runs_of(prism) if run.method == "coteaching"}
    assert rates == {"prism_sym10": 0.1, "prism_sym20": 0.2, "prism_sym50": 0.5}


def test_table_four_profiles_train_faces_under_sgps_settings(applied):
    """Table IV: iResNet-50 from scratch on local insightface files, the classifier rows at lr 0.1, the pair-wise
    rows (DCQ, DCQ + SGPS) at 0.06 with the x 0.1 steps at epochs 4, 8 and 9."""
    classifier, pairwise = applied["sgps/table4_classifier"], applied["sgps/table4_pairwise"]
    for params in (classifier, pairwise):
        assert params["train"]["backbone"] == "iresnet50" and params["train"]["pretrained"] == "none"
        assert params["train"]["schedule"]["milestones"] == [4, 8, 9] and params["train"]["epochs"] == 10
        assert params["datasets"]["ms1mv0"]["source"] == "local" and params["report"]["settings_of"] == "sgps"
    assert classifier["train"]["optimizer"]["lr"] == 0.1 and pairwise["train"]["optimizer"]["lr"] == 0.06
    assert pairwise["methods"]["dcq_sgps"]["positive_source"] == "forward"
    assert pairwise["methods"]["dcq"]["queue_size"] == pairwise["methods"]["dcq_sgps"]["memory_size"] == 8192



def test_the_plan_gives_every_figure_its_basis_and_says_what_does_not_fit(applied):
    """sgps/table4_pairwise at MS1MV0's size: the bank (10M x 512 float32) is in the method's buffers, built on the
    meta device; on the paper's 8 processes it fits the node; on one process the activations of 512 images and their
    forwarded positives do not, and the plan says so with the figure."""
    import copy

    from noisydml.tools.plan import MACHINE, plan_text, profile_plan

    params = applied["sgps/table4_pairwise"]
    plan = profile_plan("sgps/table4_pairwise", params)
    run = plan.largest("gpu")
    assert run.run == "ms1mv0/clean/dcq_sgps" and run.processes == 8 and run.images == 10_000_000
    assert run.gpu["method buffers (memories, banks, per-row state)"].bytes >= 10_000_000 * 512 * 4
    assert run.host["SGM pass"].bytes < 0.2 * MACHINE.host_bytes  # once, on rank 0
    assert not plan.misfits()
    text = plan_text(plan)
    assert "**Fits.**" in text
    for part in ("gpu", "host", "disk"):
        assert all(figure.basis for figure in getattr(run, part).values())
    single = copy.deepcopy(params)
    single["runtime"]["processes"] = 1
    misfits = profile_plan("sgps/table4_pairwise", single).misfits()
    assert misfits and misfits[0].startswith("GPU memory: ms1mv0/clean/dcq_sgps needs ")


def test_loader_workers_share_the_cores_among_a_run_s_processes(monkeypatch):
    import os

    from noisydml.runtime import loader_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert loader_workers({"loader_workers": -1, "processes": 1}) == 63
    assert loader_workers({"loader_workers": -1, "processes": 8}) == 7
    assert loader_workers({"loader_workers": 3, "processes": 8}) == 3


def test_prism_s_selection_at_sop_scale_keeps_almost_nothing_under_the_authors_rule(applied):
    """P26 at SOP's scale (11,318 classes, memory 8,192): simulated, the authors' rule keeps a few % of the scorable
    samples, ours about half; the profiles table and the report's caption say so (from the committed measurement,
    which must cover every profile's setting)."""
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    from bench_prism_scale import simulate

    from noisydml.tools.plan import selection_settings
    from noisydml.tools.profiles import kept_shares
    from noisydml.studies.prism import selection_caption

    settings = selection_settings(applied["prism/table1_sop"])
    assert {(s["classes"], s["memory_size"]) for s in settings} == {(11318, 8192)}
    authors = simulate(11318, 8192, batches=100, rule="authors")
    ours = simulate(11318, 8192, batches=100, rule="ours")
    assert authors["kept_share_of_scorable"] < 0.1 < 0.4 < ours["kept_share_of_scorable"]
    for name in PROFILES:  # every profile's setting is in the committed measurement
        kept_shares(applied[name])
    caption = "\n".join(selection_caption(REPO / "references" / "prism_selection_scale.json"))
    assert "PRISM's selection at the papers' scales" in caption and "11,318" in caption and "2.6%" in caption
