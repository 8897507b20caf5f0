"""A run keeps its method's own per-sample decisions (``decisions.npz``): what a label audit reads of a method."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from conftest import fit_job, tiny_params
from noisydml.config import load_params
from noisydml.methods import method_names
from noisydml.tools.check import check_all

PARAMS = check_all(load_params("params.yaml"))


def test_a_run_keeps_its_methods_decisions_and_a_deciding_nothing_method_writes_none(raw_params, tmp_path):
    from noisydml.config import validate_params
    from noisydml.pipeline.corrupt import corrupt
    from noisydml.pipeline.layout import DECISIONS, Layout
    from noisydml.pipeline.prepare import prepare
    from noisydml.pipeline.train import train
    from noisydml.runs import GRID, Run

    raw = tiny_params(raw_params)
    raw["grid"].update(noises=["sym50"], methods=["prism", "ms"], seeds=[0])
    raw["chains"] = {}
    params = validate_params(raw)
    layout = Layout(tmp_path)
    prepare(params, "glyphs", layout)
    corrupt(params, "glyphs", "sym50", layout)
    prism = train(params, Run(GRID, "glyphs-sym50-prism-0", "glyphs", "sym50", "prism", 0, "prism"), layout)
    saved = np.load(prism / DECISIONS)
    rows = np.load(prism / "train_embeddings.npz")["sample_ids"]
    assert set(saved.files) >= {"sample_id", "keep"}
    np.testing.assert_array_equal(np.sort(saved["sample_id"]), np.sort(rows))
    assert len(saved["keep"]) == len(saved["sample_id"])
    ms = train(params, Run(GRID, "glyphs-sym50-ms-0", "glyphs", "sym50", "ms", 0, "ms"), layout)
    assert not (ms / DECISIONS).exists()


#: The methods that decide about samples (:meth:`~noisydml.methods.base.Method.decisions`) once past their warm-ups,
#: and the fields they fill; every other method must decide nothing. A new deciding method is added here.
DECIDING = {
    "bspml": {"weights"}, "spms": {"weights"},
    "coteaching": {"keep"}, "coteaching_plus": {"keep"}, "coteaching_t": {"keep"},
    "dividemix": {"keep", "confidence", "pseudo_labels"}, "unicon": {"keep", "confidence", "pseudo_labels"},
    "prism": {"keep"}, "softtriple_prism": {"keep"}, "subcenter_arcface": {"keep"},
    "sgps": {"keep"}, "sgps_contextual": {"keep"}, "sgps_roadmap": {"keep"}, "sgps_supcon": {"keep"},
    "dcq_sgps": {"keep"},
    "lra_diffusion": {"pseudo_labels", "confidence"},
    "spa_confidence": {"keep", "pseudo_labels", "confidence"},
    "spa_smooth_loss": {"keep", "weights", "pseudo_labels", "confidence"},
}
#: Past every warm-up in a 2-epoch fit.
PAST_WARM_UP = {"dividemix": {"warmup_epochs": 1}, "unicon": {"warmup_epochs": 1},
                "subcenter_arcface": {"drop_epoch": 1}, "f_correction": {"estimate_after_epochs": 1}}


@pytest.fixture(scope="module")
def glyph_sets():
    from noisydml.data import glyphs
    from noisydml.engine.types import ImageSet

    images, labels, _ = glyphs.generate(12, 6, 16, seed=0)
    train, test = labels < 6, labels >= 6
    return ImageSet(images[train], labels[train]), ImageSet(images[test], labels[test])


@pytest.mark.parametrize("name", method_names())
def test_every_method_s_decisions_reach_the_audit_in_its_schema(name, glyph_sets, tmp_path):
    """Each method, fitted by the real trainer past its warm-ups, then its decisions written as a run writes them
    and read by the audit: the audit schema over every training row (by sample id), scores in [0, 1], flags
    exactly where the method keeps or drops, suggestions only of other trained labels; a method outside
    :data:`DECIDING` writes nothing."""
    from noisydml.audit import AUDIT_COLUMNS
    from noisydml.audit.detectors import method_decisions
    from noisydml.engine.types import RunSpec
    from noisydml.pipeline.layout import DECISIONS
    from noisydml.pipeline.train import per_sample_decisions

    train_set, test_set = glyph_sets
    labels = train_set.labels
    n = len(labels)
    sample_ids = np.arange(n)[::-1] + 1000  # not the row numbers: the audit must map by id
    cfg = {**PARAMS["train"], "epochs": 2, "batch": {"classes": 3, "per_class": 2}, "backbone_width": 4,
           "embedding_dim": 8}
    hparams = {**copy.deepcopy(PARAMS["methods"][name]), **PAST_WARM_UP.get(name, {})}
    # what a chained smooth_proxy_anchor run gets from its phase 1: certain of the given labels
    inputs = {"confidence_classes": labels[:, None], "confidence_values": np.ones((n, 1), np.float32),
              "confidence_label": labels}
    result = fit_job(RunSpec(name, hparams, cfg, seed=5, data_fingerprint="test"), train_set, test_set,
                     tmp_path / "fit.pt", runtime={**PARAMS["runtime"], "progress": False}, sample_ids=sample_ids,
                     inputs=inputs)
    from noisydml.methods import load_spec

    assert set(result.exports) == set(load_spec(name).exports)  # what a chain's labels and inputs may name
    fields = per_sample_decisions(result.final_decisions)
    if fields:  # as the train stage writes them (the first test above checks its file)
        np.savez(tmp_path / DECISIONS, sample_id=sample_ids, **fields)
    if name not in DECIDING:
        assert not (tmp_path / DECISIONS).exists(), f"{name} decides; list it in DECIDING"
        return
    assert set(fields) - {"visits"} == DECIDING[name]
    saved = dict(np.load(tmp_path / DECISIONS))
    order = np.random.default_rng(0).permutation(n)  # the audit's rows in another order than the run's
    frame = method_decisions(saved, sample_ids[order], labels[order])
    assert tuple(frame.columns) == AUDIT_COLUMNS and len(frame) == n
    assert (frame["sample_id"].to_numpy() == sample_ids[order]).all()
    assert (frame["given_label"].to_numpy() == labels[order]).all()
    score = frame["score"].to_numpy()
    assert np.isfinite(score).all() and score.min() >= 0 and score.max() <= 1
    flagged = frame["flagged"]
    if "keep" in DECIDING[name]:
        assert flagged.notna().all()
        keep = pd.Series(saved["keep"], index=saved["sample_id"]).loc[sample_ids[order]].to_numpy()
        decided = ~np.isnan(keep)  # NaN: no decision this epoch (a row no batch visited)
        np.testing.assert_array_equal(flagged.to_numpy(bool), decided & (np.nan_to_num(keep, nan=1.0) < 0.5))
        np.testing.assert_allclose(score, np.where(decided, 1 - keep, 0.0))
    else:
        assert flagged.isna().all()  # a weight or a confidence has no threshold of the method's own
    suggested = frame["suggested_label"].to_numpy()
    made = suggested >= 0
    assert (suggested[~made] == -1).all()
    assert np.isin(suggested[made], np.unique(labels)).all() and (suggested[made] != labels[order][made]).all()
