"""Paper profiles: each validates against params.yaml, its run count is what its grid trains, and its command
sets exactly its overrides."""

import shlex

import pytest
import yaml

from noisydml.pipeline.check import validate_all
from noisydml.pipeline.profiles import apply_overrides, exp_command, load_profiles
from noisydml.schema import ParamsError

from conftest import REPO

PROFILES = load_profiles(REPO / "profiles")


def test_every_paper_has_profiles():
    papers = {name.split("/")[0] for name in PROFILES}
    assert papers == {"prism", "sgps", "bspml"}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_validates_and_counts_its_runs(name, raw_params):
    profile = PROFILES[name]
    params = validate_all(apply_overrides(raw_params, profile["set"]))
    grid = params["grid"]
    assert profile["runs"] == len(grid["datasets"]) * len(grid["noises"]) * len(grid["methods"]) * len(grid["seeds"])
    assert params["train"]["pretrained"] in params["weights"]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_command_sets_exactly_the_overrides(name):
    words = shlex.split(exp_command(name, PROFILES[name]).replace("\\\n", " "))
    assert words[:4] == ["dvc", "exp", "run", "-n"]
    pairs = [words[i + 1] for i, w in enumerate(words) if w == "-S"]
    parsed = {p.split("=", 1)[0]: yaml.safe_load(p.split("=", 1)[1]) for p in pairs}
    assert parsed == PROFILES[name]["set"]


def test_an_override_of_a_missing_section_is_an_error(raw_params):
    with pytest.raises(ParamsError, match="params.yaml has no 'nothing'"):
        apply_overrides(raw_params, {"nothing.here": 1})
