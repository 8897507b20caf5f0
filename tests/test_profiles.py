"""Paper profiles: each is applied by DVC's own override code and validates, its run count is what its grid
trains, and its command sets exactly its overrides."""

import shlex

import pytest

from noisydml.pipeline.profiles import exp_command, load_profiles, params_after
from noisydml.schema import ParamsError

from conftest import REPO

PROFILES = load_profiles(REPO / "profiles")


def test_every_paper_has_profiles():
    papers = {name.split("/")[0] for name in PROFILES}
    assert papers == {"prism", "sgps", "bspml"}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_validates_and_counts_its_runs(name):
    params = params_after(PROFILES[name]["set"], REPO / "params.yaml")
    grid = params["grid"]
    assert PROFILES[name]["runs"] == (len(grid["datasets"]) * len(grid["noises"]) * len(grid["methods"])
                                      * len(grid["seeds"]))
    assert params["train"]["pretrained"] in params["weights"]
    assert params["chains"] == {}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_command_sets_exactly_the_overrides(name):
    words = shlex.split(exp_command(name, PROFILES[name]).replace("\\\n", " "))
    assert words[:4] == ["dvc", "exp", "run", "-n"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "-S"] == PROFILES[name]["set"]


def test_an_override_dvc_refuses_is_an_error():
    with pytest.raises(ParamsError, match="DVC refuses"):
        params_after(["nothing.here=1"], REPO / "params.yaml")
