"""Paper profiles: each is applied by DVC's own override code and validates, its run count is what its grid and
chains train, every setting that changes a result says where it comes from, the README prints the generated
tables, and its command sets exactly its overrides."""

import shlex

import pytest

from noisydml.pipeline.profiles import (PROFILES_PAGE, SETTINGS_BEGIN, SETTINGS_END, exp_command, load_profiles, params_after,
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
    assert params["train"]["pretrained"] in params["weights"]
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
    text = profiles_table(PROFILES, applied) + "\n" + settings_tables(PROFILES)
    assert readme_with_settings(readme, text) == readme, \
        f"{PROFILES_PAGE}'s profile tables are stale: python scripts/paper_profile.py settings --write"
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
