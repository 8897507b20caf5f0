"""Tuning (params.yaml `tuning`, noisydml.tuning, the tune stage): the same budget for every method, scored on
held-out training classes, resumable, and read by the tuned runs through a DVC edge."""

import copy
import json
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import dvc_repo, repository_params, run_command, tiny_params
from noisydml.config import validate_params
from noisydml.schema import ParamsError

SPACE = {"train.optimizer.lr": {"low": 0.0001, "high": 0.003, "log": True},
         "loss.neg_margin": {"low": 0.3, "high": 0.7, "paper": 0.4}}


def tuning_params(raw, trials=3, methods=("mcl",)):
    raw = tiny_params(raw)
    raw["train"]["epochs"] = 2
    raw["grid"].update(noises=["sym50"], methods=["mcl"], seeds=[0])
    raw["chains"] = {}
    raw["tuning"].update(datasets=["glyphs"], noises=["sym50"], methods=list(methods), trials=trials,
                         validation_classes=2, sampler={"name": "tpe", "startup_trials": 1})
    raw["tuning"]["spaces"] = {"mcl": copy.deepcopy(SPACE)}
    return raw


def prepared(root, params):
    from noisydml.pipeline.corrupt import corrupt
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.prepare import prepare

    layout = Layout(root)
    prepare(params, "glyphs", layout)
    corrupt(params, "glyphs", "sym50", layout)
    return layout


class Tripwire:
    """A test split that fails the test the moment anything reads it (its images, labels, anything)."""

    def __getattr__(self, name):
        raise AssertionError(f"a tuning trial read the test split ({name})")


def poisoned(load):
    def load_with_poisoned_test_split(*args, **kwargs):
        data = load(*args, **kwargs)
        data.test_set, data.test_rows = Tripwire(), Tripwire()
        return data

    return load_with_poisoned_test_split


def trials_of(layout):
    table = pd.read_csv(layout.root / "tuning/glyphs/sym50/mcl/trials.csv")
    return table.to_dict("records")


def test_a_study_resumes_after_a_kill_with_the_same_trials_and_never_reads_the_test_split(raw_params, tmp_path,
                                                                                            monkeypatch):
    import noisydml.pipeline.tune as tune_module

    params = validate_params(tuning_params(raw_params))
    monkeypatch.setattr(tune_module, "load_run_data", poisoned(tune_module.load_run_data))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")

    through = prepared(tmp_path / "through", params)
    tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl", through)
    uninterrupted = trials_of(through)
    assert [t["trial"] for t in uninterrupted] == [0, 1, 2]
    # the paper's values first (lr: params.yaml's, the paper gives none), then the untuned run's
    assert uninterrupted[0]["loss.neg_margin"] == 0.4 and uninterrupted[1]["loss.neg_margin"] == 0.5
    assert uninterrupted[0]["first"] and uninterrupted[1]["first"] and not uninterrupted[2]["first"]

    killed = prepared(tmp_path / "killed", params)
    monkeypatch.setenv("NOISYDML_STOP_AFTER_EPOCH", "1")
    monkeypatch.setenv("NOISYDML_STOP_IN_TRIAL", "2")  # the sampled trial, killed after its first epoch
    with pytest.raises(KeyboardInterrupt):
        tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl", killed)
    assert (killed.root / ".checkpoints/tuning/glyphs/sym50/mcl/trial2/last.pt").is_file()
    assert not (killed.root / "tuning/glyphs/sym50/mcl/chosen.json").exists()
    monkeypatch.delenv("NOISYDML_STOP_AFTER_EPOCH")
    tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl", killed)
    assert trials_of(killed) == uninterrupted  # same values, same scores, bit for bit
    for number in range(3):
        a = pd.read_csv(through.root / f"tuning/glyphs/sym50/mcl/trials/{number}.csv")
        b = pd.read_csv(killed.root / f"tuning/glyphs/sym50/mcl/trials/{number}.csv")
        pd.testing.assert_frame_equal(a.drop(columns=[c for c in a if "seconds" in c]),
                                      b.drop(columns=[c for c in b if "seconds" in c]))
    chosen = json.loads((killed.root / "tuning/glyphs/sym50/mcl/chosen.json").read_text())
    best = max(uninterrupted, key=lambda t: (t["val_precision_at_1"], -t["trial"]))
    assert chosen["trial"] == best["trial"] and chosen["values"]["loss.neg_margin"] == best["loss.neg_margin"]
    assert [t["trial"] for t in chosen["first_trials"]] == [0, 1]

    # a larger budget keeps the trials run; other settings start afresh
    more = copy.deepcopy(params)
    more["tuning"]["trials"] = 4
    tune_module.tune(more, "glyphs", "sym50", "mcl", killed)
    assert trials_of(killed)[:3] == uninterrupted and len(trials_of(killed)) == 4
    other = copy.deepcopy(params)
    other["tuning"]["seed"] = 1
    tune_module.tune(other, "glyphs", "sym50", "mcl", killed)
    assert [t["trial"] for t in trials_of(killed)] == [0, 1, 2]


def test_the_grid_sampler_tries_every_choice_once_in_order_whatever_the_trial_budget(raw_params, tmp_path, monkeypatch):
    """BSPML's RDML: "eta selected from {0.5, 1, 2, 3, 4}": each value one trial, the budget the grid's size."""
    import noisydml.pipeline.tune as tune_module

    raw = tuning_params(raw_params, trials=8)
    raw["train"]["epochs"] = 1
    raw["tuning"]["sampler"]["name"] = "grid"
    raw["tuning"]["spaces"]["mcl"] = {"loss.neg_margin": {"choices": [0.3, 0.5, 0.7]}}
    params = validate_params(raw)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    layout = prepared(tmp_path, params)
    tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl", layout)
    assert [(t["trial"], t["loss.neg_margin"]) for t in trials_of(layout)] == [(0, 0.3), (1, 0.5), (2, 0.7)]
    chosen = json.loads((layout.root / "tuning/glyphs/sym50/mcl/chosen.json").read_text())
    assert chosen["values"]["loss.neg_margin"] in (0.3, 0.5, 0.7)


def test_a_trial_is_scored_by_the_mean_of_its_seeds(raw_params, tmp_path, monkeypatch):
    """tuning.seeds: each trial trains once per seed and its value is the mean of their validation P@1; each seed's
    score is in trials.csv, its epochs in trials/<k>.csv; the budget is trials x seeds runs."""
    import noisydml.pipeline.tune as tune_module

    raw = tuning_params(raw_params, trials=2)
    raw["train"]["epochs"] = 1
    raw["tuning"]["seeds"] = [0, 1]
    params = validate_params(raw)
    monkeypatch.setattr(tune_module, "load_run_data", poisoned(tune_module.load_run_data))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    layout = prepared(tmp_path / "two", params)
    tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl", layout)
    folder = layout.root / "tuning/glyphs/sym50/mcl"
    for trial in trials_of(layout):
        epochs = pd.read_csv(folder / f"trials/{trial['trial']}.csv")
        last = {seed: float(group["val_precision_at_1"].iloc[-1]) for seed, group in epochs.groupby("seed")}
        assert set(last) == {0, 1}
        assert trial["val_precision_at_1_seed0"] == last[0] and trial["val_precision_at_1_seed1"] == last[1]
        assert trial["val_precision_at_1"] == pytest.approx((last[0] + last[1]) / 2, abs=1e-12)
    chosen = json.loads((folder / "chosen.json").read_text())
    assert chosen["seeds"] == [0, 1] and chosen["budget_runs"] == 4 and "mean over the trial's seeds" in chosen["objective"]
    # seed 0 of a two-seed trial is the one-seed study's trial, bit for bit; seed 1 trains another run
    one = copy.deepcopy(params)
    one["tuning"]["seeds"] = [0]
    single = prepared(tmp_path / "one", one)
    tune_module.tune(one, "glyphs", "sym50", "mcl", single)
    assert [t["val_precision_at_1"] for t in trials_of(single)] == [t["val_precision_at_1_seed0"]
                                                                    for t in trials_of(layout)]
    assert any(t["val_precision_at_1_seed0"] != t["val_precision_at_1_seed1"] for t in trials_of(layout))


CHAIN = {"dataset": "glyphs", "noise": "sym50", "seeds": "grid", "init": {"model": False, "method": False},
         "labels": {"label": "", "keep": "", "kind": "label_ids"}, "inputs": [], "hparams": {}, "train": {}}


def chain_tuning_params(raw, trials=2):
    """A two-step chain tuned by name: prism -> ms on the samples it kept (ms_kept) -> mcl from ms_kept's weights
    (mcl_after, the chain tuned): its study trains prism and ms_kept on the tuning split first."""
    raw = tuning_params(raw, trials=trials, methods=())
    raw["grid"]["methods"] = ["prism"]
    raw["methods"]["prism"]["memory_size"] = 64
    raw["chains"] = {
        "ms_kept": {**copy.deepcopy(CHAIN), "name": "ms_kept", "method": "ms", "upstream": "prism",
                    "labels": {"label": "", "keep": "keep", "kind": "label_ids"}},
        "mcl_after": {**copy.deepcopy(CHAIN), "name": "mcl_after", "method": "mcl", "upstream": "ms_kept",
                      "init": {"model": True, "method": False}, "hparams": {"loss": {"neg_margin": 0.45}}},
    }
    raw["tuning"]["chains"] = ["mcl_after"]
    return raw


def test_a_chain_study_trains_its_upstream_runs_on_the_tuning_split_once_and_resumes(raw_params, tmp_path,
                                                                                     monkeypatch):
    import noisydml.pipeline.tune as tune_module

    params = validate_params(chain_tuning_params(raw_params, trials=3))
    monkeypatch.setattr(tune_module, "load_run_data", poisoned(tune_module.load_run_data))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    fits = []
    real_fit = tune_module._TrialTrainer._fit
    monkeypatch.setattr(tune_module._TrialTrainer, "_fit",
                        lambda self, params, method, part, *a, **k: fits.append(part) or real_fit(
                            self, params, method, part, *a, **k))

    through = prepared(tmp_path / "through", params)
    folder = tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl_after", through)
    assert fits == ["upstream/prism", "upstream/ms_kept", "trial0", "trial1", "trial2"]
    # the upstream runs saw the kept classes only: their exports cover exactly the trials' training samples
    data = tune_module.load_run_data("glyphs", "sym50", through, 2, 0)
    exported = np.load(folder / "upstream/prism/exports.npz")["sample_id"]
    assert np.array_equal(np.sort(exported), np.sort(data.sample_ids)) and data.val_index is not None
    assert not set(exported) & set(data.train_rows["sample_id"].to_numpy()[data.val_index])
    assert (folder / "upstream/ms_kept/model.pt").is_file()
    trials = pd.read_csv(folder / "trials.csv").to_dict("records")
    # the chain's own values are the untuned run's (its hparams override methods.mcl), the paper's come first
    assert trials[0]["loss.neg_margin"] == 0.4 and trials[1]["loss.neg_margin"] == 0.45
    chosen = json.loads((folder / "chosen.json").read_text())
    assert chosen["upstream"].startswith("prism -> ms_kept, untuned")

    fits.clear()
    killed = prepared(tmp_path / "killed", params)
    monkeypatch.setenv("NOISYDML_STOP_AFTER_EPOCH", "1")
    monkeypatch.setenv("NOISYDML_STOP_IN_TRIAL", "1")
    with pytest.raises(KeyboardInterrupt):
        tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl_after", killed)
    monkeypatch.delenv("NOISYDML_STOP_AFTER_EPOCH")
    tune_module.tune(copy.deepcopy(params), "glyphs", "sym50", "mcl_after", killed)
    # the upstream runs trained once; the killed trial resumed; the same trials, bit for bit
    assert fits == ["upstream/prism", "upstream/ms_kept", "trial0", "trial1", "trial1", "trial2"]
    assert pd.read_csv(killed.root / "tuning/glyphs/sym50/mcl_after/trials.csv").to_dict("records") == trials


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update(methods=["prism"]), "tuning.methods[0]: 'prism' has no search space"),
    (lambda t: t["spaces"]["mcl"].update({"loss.nope": {"low": 0.1, "high": 0.2}}), "loss.nope is not a key"),
    (lambda t: t["spaces"]["mcl"].update({"loss.neg_margin": {"low": 0.1, "high": 0.2}}), "outside the space"),
    (lambda t: t["spaces"]["mcl"]["loss.neg_margin"].update(paper=0.9), "tuning.spaces.mcl.loss.neg_margin.paper"),
    (lambda t: t["spaces"]["mcl"].update({"train.optimizer.lr": {"low": 0.0, "high": 0.1, "log": True}}),
     "on a log scale"),
    (lambda t: t.update(noises=["sc75"]), "tuning.noises[0]"),
    (lambda t: t.update(trials=0), "tuning.trials"),
    (lambda t: t.update(seeds=[]), "tuning.seeds: []"),
    (lambda t: t.update(seeds=[0, 0]), "tuning.seeds"),
    (lambda t: t.update(seeds=[-1]), "tuning.seeds: [-1]"),
    (lambda t: t.update(chains=["sgps_posterior"]), "tuning.chains[0]: 'sgps_posterior' is no chained run of glyphs/sym50"),
    (lambda t: t["sampler"].update(name="grid"), "tuning.spaces.mcl.train.optimizer.lr: a range under tuning.sampler.name grid"),
])
def test_tuning_section_is_refused_with_the_key_and_value(raw_params, edit, message):
    raw = tuning_params(raw_params)
    edit(raw["tuning"])
    with pytest.raises(ParamsError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        validate_params(raw)


@pytest.mark.parametrize("edit, message", [
    (lambda raw: raw["tuning"]["spaces"].pop("mcl"), "tuning.chains[0]: 'mcl_after' trains 'mcl' (chains.mcl_after.method), "
                                                     "which has no search space"),
    (lambda raw: raw["chains"]["mcl_after"]["hparams"]["loss"].update(neg_margin=0.9),
     "tuning.spaces.mcl.loss.neg_margin: chains.mcl_after's value methods.mcl.loss.neg_margin = 0.9"),
    (lambda raw: raw["tuning"].update(chains=["mcl_after", "mcl_after"]), "tuning.chains"),
    (lambda raw: raw["tuning"]["sampler"].update(name="grid"),
     "tuning.spaces.mcl.train.optimizer.lr: a range under tuning.sampler.name grid"),
])
def test_a_tuned_chain_is_refused_with_the_key_and_value(raw_params, edit, message):
    raw = chain_tuning_params(raw_params)
    edit(raw)
    with pytest.raises(ParamsError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")
                       .replace("(", r"\(").replace(")", r"\)")):
        validate_params(raw)


def test_the_committed_spaces_hold_every_untuned_and_paper_value(raw_params):
    """params.yaml's spaces, each tuned: every untuned value and every paper value lies inside its space."""
    raw = copy.deepcopy(raw_params)
    raw["tuning"]["methods"] = list(raw["tuning"]["spaces"])
    params = validate_params(raw)
    from noisydml.tuning import first_trials

    for method, space in params["tuning"]["spaces"].items():
        assert first_trials(params, method, space)[0].keys() == space.keys()


@pytest.mark.parametrize("method, baseline", [("prism", "mcl"), ("sgps", "prism"), ("bspml", "ms_rho1"),
                                              ("spa_smooth_loss", "proxy_anchor_frozen")])
def test_a_papers_method_searches_every_key_its_baseline_searches(raw_params, method, baseline):
    """Tuning never favours a baseline by what it may change: the method's space holds the baseline's keys, with
    the same ranges (the method adds its own keys)."""
    spaces = validate_params(raw_params)["tuning"]["spaces"]
    for key, entry in spaces[baseline].items():
        assert key in spaces[method], f"tuning.spaces.{method} lacks {key}, which {baseline} searches"
        ranges = ("low", "high", "log", "choices")
        assert {k: entry.get(k) for k in ranges} == {k: spaces[method][key].get(k) for k in ranges}, key


TUNED_RUN = "train_tuned@glyphs-sym50-mcl-0"
TUNED_CHAIN = "train_tuned_chain@glyphs-sym50-mcl_after"


@pytest.fixture(scope="module")
def tuned_repo(tmp_path_factory):
    """One repository for both checks below: mcl tuned (tuning.methods) and the chain prism -> ms_kept -> mcl_after
    tuned (tuning.chains), both tuned runs made by one `dvc repro` (their data stages shared)."""
    root = tmp_path_factory.mktemp("tuned")
    raw = chain_tuning_params(repository_params())
    raw["tuning"]["methods"] = ["mcl"]
    env, _ = dvc_repo(root, raw, repro=False)
    run_command([sys.executable, "-m", "dvc", "repro", TUNED_RUN, TUNED_CHAIN], root, env)
    return root, env


@pytest.mark.e2e
def test_chosen_values_reach_the_tuned_run_through_a_dvc_edge(tuned_repo):
    root, env = tuned_repo
    dag = run_command([sys.executable, "-m", "dvc", "dag", "--md", TUNED_RUN], root, env)
    assert "tune@glyphs-sym50-mcl" in dag
    chosen = json.loads((root / "tuning/glyphs/sym50/mcl/chosen.json").read_text())
    run = json.loads((root / "runs/glyphs/sym50/mcl_tuned/seed0/run.json").read_text())
    assert run["tuned"]["values"] == chosen["values"]
    model = __import__("torch").load(root / "runs/glyphs/sym50/mcl_tuned/seed0/model.pt", weights_only=False)
    assert np.isclose(model["train"]["optimizer"]["lr"], chosen["values"]["train.optimizer.lr"])
    assert not (root / "runs/glyphs/sym50/mcl_tuned/seed0/test_embeddings.npz").stat().st_size == 0
    status = run_command([sys.executable, "-m", "dvc", "status", TUNED_RUN], root, env)
    assert "up to date" in status


@pytest.mark.e2e
def test_a_tuned_chain_trains_from_the_grids_upstream_with_its_studys_values_through_dvc_edges(tuned_repo):
    root, env = tuned_repo
    dag = run_command([sys.executable, "-m", "dvc", "dag", "--md", TUNED_CHAIN], root, env)
    assert "tune_chain@glyphs-sym50-mcl_after" in dag and "train_chain@mcl_after" in dag
    chosen = json.loads((root / "tuning/glyphs/sym50/mcl_after/chosen.json").read_text())
    run = json.loads((root / "runs/glyphs/sym50/mcl_after_tuned/seed0/run.json").read_text())
    assert run["tuned"]["values"] == chosen["values"]
    # from the grid's upstream (trained on every training class), as the untuned chain is
    assert run["upstream"]["run"] == "runs/glyphs/sym50/ms_kept/seed0"
    model = __import__("torch").load(root / "runs/glyphs/sym50/mcl_after_tuned/seed0/model.pt", weights_only=False)
    assert np.isclose(model["train"]["optimizer"]["lr"], chosen["values"]["train.optimizer.lr"])
    status = run_command([sys.executable, "-m", "dvc", "status", TUNED_CHAIN], root, env)
    assert "up to date" in status


@pytest.mark.parametrize("dataset", ["glyphs", "motifs"])
def test_the_orderings_experiment_is_valid_through_dvcs_own_overrides(tmp_path, dataset):
    """scripts/tuning_orderings.py's -S arguments, applied by DVC's code to params.yaml, validate and tune every
    method and chain of the comparisons at both noises."""
    import shutil

    from dvc.utils.hydra import apply_overrides

    from conftest import REPO, load_script
    from noisydml.config import load_params
    from noisydml.tools.check import check_all
    from noisydml.runs import runs_of

    script = load_script("tuning_orderings")
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    apply_overrides(tmp_path / "params.yaml", script.overrides(dataset))
    params = check_all(load_params(tmp_path / "params.yaml"))
    tuned = {r.name for r in runs_of(params) if r.kind.name == "tuned"}
    assert tuned == {f"{name}_tuned" for name in script.METHODS + script.CHAINED}
    assert {r.noise for r in runs_of(params)} == set(script.NOISES) and params["grid"]["seeds"] == [0, 1, 2]


@pytest.mark.parametrize("family, dataset, noise", [("sgps", "glyphs", "sym50"), ("sgps", "motifs", "sc50"),
                                                    ("spa", "glyphs", "sc50"), ("spa", "motifs", "sym50"),
                                                    ("posterior", "glyphs", "sc50")])
def test_the_ablation_grids_are_valid_through_dvcs_own_overrides(tmp_path, family, dataset, noise):
    """scripts/method_ablations.py's -S arguments (docs/ablations.md), applied by DVC's code to params.yaml, validate
    and train every variant at 3 seeds beside its baseline: SGPS's as figures.sgps_ablations runs, Smooth
    Proxy-Anchor's readings as chained runs from phase 1."""
    import shutil

    from dvc.utils.hydra import apply_overrides

    from conftest import REPO, load_script
    from noisydml.config import load_params
    from noisydml.tools.check import check_all
    from noisydml.studies import all_runs

    script = load_script("method_ablations")
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    apply_overrides(tmp_path / "params.yaml", script.overrides(family, dataset, noise))
    params = check_all(load_params(tmp_path / "params.yaml"))
    runs = all_runs(params)
    assert {(r.dataset, r.noise) for r in runs} == {(dataset, noise)}
    names = {r.name for r in runs}
    if family == "sgps":
        assert names == {"prism", "sgps", *(f"sgps_{v}" for v in script.SGPS_VARIANTS)}
        hp = {r.name: r.params(params)["methods"]["sgps"] for r in runs if r.name.startswith("sgps_")}
        assert hp["sgps_fwd_authors"]["authors"] == {"selection_on_all": True, "clean_loss_on_all": True,
                                                     "positives_update_bank": True}
        assert hp["sgps_forward"]["authors"]["selection_on_all"] is False
    elif family == "posterior":
        assert names == {"prism", "sgps", "sgps_posterior_stage2", "sgps_posterior"}
        shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
        apply_overrides(tmp_path / "params.yaml", script.overrides(family, dataset, noise, ["forward"]))
        forward = check_all(load_params(tmp_path / "params.yaml"))
        chained = {r.name: r.params(forward)["methods"]["sgps"]["positive_source"] for r in all_runs(forward)
                   if r.name in ("sgps", "sgps_posterior")}
        assert chained == {"sgps": "forward", "sgps_posterior": "forward"}
    else:
        assert names == {"proxy_anchor_frozen", "spa_confidence", "ms_rho1", "bspml", *script.SPA_READINGS}
        hp = {r.name: r.params(params)["methods"]["spa_smooth_loss"] for r in runs if r.name in script.SPA_READINGS}
        assert hp["spa_one_sided"]["smoothing"] == "one_sided" and hp["spa_neg1"]["weight_negatives"] is False
    assert {r.seed for r in runs} == {0, 1, 2}
