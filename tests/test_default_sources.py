"""Every default of params.yaml's train, pretrain and methods sections has one stated source
(params.sources.yaml), and none is ground truth: the tuned ones still hold the values their tuning chose."""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import load_script

REPO = Path(__file__).resolve().parents[1]
default_sources = load_script("default_sources")


def _load():
    return (yaml.safe_load((REPO / "params.yaml").read_text()),
            yaml.safe_load((REPO / "params.sources.yaml").read_text()))


def test_every_value_has_exactly_one_source_and_tuned_values_are_current():
    params, sources = _load()
    rows, problems = default_sources.table(params, sources)
    assert not problems, "\n".join(problems)
    assert len(rows) == sum(1 for s in ("train", "pretrain", "methods") for _ in default_sources.flatten(params[s]))


def test_tuned_values_say_how_and_never_use_the_truth_or_the_test_split():
    _, sources = _load()
    tuned = [item for spec in [sources["train"], *sources["methods"].values()] for item in spec.get("tuned", [])]
    assert tuned
    for item in tuned:
        how = " ".join(item["how"].split()).lower()
        assert "held-out" in how or "not a score" in how, item
        assert "test" not in how.replace("test split", "") or "never" in how, item


def test_a_changed_value_or_an_unlisted_key_is_reported():
    params, sources = _load()
    params["methods"]["sgps"]["sgm"]["lambda_min"] = 0.123
    params["methods"]["ms"]["loss"]["new_knob"] = 1.0
    params["methods"]["spms"]["lr_multiplier"] = 7.0
    _, problems = default_sources.table(params, sources)
    text = "\n".join(problems)
    assert "methods.sgps.sgm.lambda_min: params.yaml has 0.123" in text
    assert "methods.ms.loss.new_knob: listed 0 times" in text
    assert "methods.spms.lr_multiplier: 7.0, but it is listed as methods.bspml's" in text
    # the sgps variants share SGM's thresholds: the changed value is reported for them too
    assert "methods.sgps_supcon.sgm.lambda_min: 0.5, but it is listed as methods.sgps's, which is 0.123" in text
