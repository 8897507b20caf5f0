"""A run keeps its method's own per-sample decisions (``decisions.npz``): what a label audit reads of a method."""

from __future__ import annotations

import numpy as np

from conftest import tiny_params


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
