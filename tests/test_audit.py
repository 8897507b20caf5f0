"""The label audit: detectors in one schema, judged against a hand-computed case, the probe out of sample."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from noisydml.audit import AUDIT_COLUMNS, detectors
from noisydml.audit.judge import judge, paired_bootstrap


def clusters(seed: int = 0, classes: int = 6, per_class: int = 40, noise: float = 0.3):
    """Well-separated Gaussian classes in 16-d; ``noise`` of the rows get another class's label."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (classes, 16)) * 4
    true = np.repeat(np.arange(classes), per_class)
    emb = centres[true] + rng.normal(0, 1, (len(true), 16))
    given = true.copy()
    flip = rng.random(len(true)) < noise
    given[flip] = (true[flip] + rng.integers(1, classes, flip.sum())) % classes
    return emb.astype(np.float32), given, true, np.arange(len(true)) + 100


def test_judge_against_a_hand_computed_case():
    scores = pd.DataFrame({"sample_id": range(6), "given_label": 0, "score": [0.9, 0.8, 0.7, 0.2, 0.1, 0.0],
                           "flagged": pd.array([True, True, False, True, False, False], dtype="boolean"),
                           "suggested_label": -1})
    noisy = np.array([True, False, True, False, False, False])
    out = judge(scores, noisy)
    # ranks: noisy at 1st and 3rd of 6. AUROC = pairs (noisy above clean) / 8: 4 + 3 = 7/8
    assert out["auroc"] == pytest.approx(7 / 8)
    assert out["auprc"] == pytest.approx((1 / 1 + 2 / 3) / 2)  # precision at each noisy row's rank
    assert out["precision_at_k"] == pytest.approx(1 / 2)  # top 2: rows 0, 1
    assert out["flag_precision"] == pytest.approx(1 / 3) and out["flag_recall"] == pytest.approx(1 / 2)
    assert out["flag_f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert out["noise_rate"] == pytest.approx(2 / 6)


@pytest.mark.parametrize("name", ["knn_disagreement", "datalab", "confident_learning"])
def test_each_detector_gives_the_schema_and_finds_flips(name):
    emb, given, true, ids = clusters()
    if name == "confident_learning":
        frame = detectors.confident_learning(detectors.cross_fitted_probabilities(emb, given, 5, 0), given, ids)
    else:
        frame = getattr(detectors, name)(emb, given, ids)
    assert tuple(frame.columns) == AUDIT_COLUMNS and len(frame) == len(given)
    assert (frame["sample_id"] == ids).all() and (frame["given_label"] == given).all()
    out = judge(frame, given != true)
    assert out["auroc"] > 0.9 and out["flag_f1"] > 0.7
    suggested = frame["suggested_label"].to_numpy()
    right = suggested[suggested >= 0] == true[suggested >= 0]
    assert right.mean() > 0.9  # a suggestion is mostly the true class


def test_the_probe_never_scores_a_row_it_was_fitted_on(monkeypatch):
    from sklearn.linear_model import LogisticRegression

    emb, given, true, ids = clusters(classes=4, per_class=20)
    key = {row.tobytes(): i for i, row in enumerate(detectors._unit(emb).astype(np.float32))}
    fitted, scored = [], []
    fit, predict = LogisticRegression.fit, LogisticRegression.predict_proba

    def recording_fit(self, x, y):
        fitted.append({key[r.tobytes()] for r in x})
        return fit(self, x, y)

    def recording_predict(self, x):
        scored.append({key[r.tobytes()] for r in x})
        return predict(self, x)

    monkeypatch.setattr(LogisticRegression, "fit", recording_fit)
    monkeypatch.setattr(LogisticRegression, "predict_proba", recording_predict)
    detectors.cross_fitted_probabilities(emb, given, folds=4, seed=0)
    assert len(fitted) == len(scored) == 4
    assert all(not f & s for f, s in zip(fitted, scored))
    assert set().union(*scored) == set(range(len(given)))


def test_method_decisions_in_the_schema():
    saved = {"sample_id": np.array([7, 5, 6]), "keep": np.array([1.0, 0.0, 0.25]),
             "pseudo_labels": np.array([2, 3, -1])}
    frame = detectors.method_decisions(saved, np.array([5, 6, 7]), np.array([1, 1, 2]))
    assert frame["score"].tolist() == [1.0, 0.75, 0.0]
    assert frame["flagged"].tolist() == [True, True, False]
    assert frame["suggested_label"].tolist() == [3, -1, -1]  # row 7's pseudo-label is its given label
    weights = detectors.method_decisions({"sample_id": np.array([5, 6]), "weights": np.array([2.0, 1.0])},
                                         np.array([5, 6]), np.array([0, 0]))
    assert weights["score"].tolist() == [0.0, 0.5] and weights["flagged"].isna().all()
    assert detectors.method_decisions({"sample_id": np.array([5])}, np.array([5]), np.array([0])) is None
    # a row the method never saw (a chained run on a subset): no decision, score 0
    partial = detectors.method_decisions({"sample_id": np.array([5]), "keep": np.array([0.0])},
                                         np.array([5, 9]), np.array([0, 0]))
    assert partial["score"].tolist() == [1.0, 0.0] and partial["flagged"].tolist() == [True, False]


def test_paired_bootstrap_interval_holds_the_difference():
    emb, given, true, ids = clusters(seed=1)
    noisy = given != true
    good = detectors.knn_disagreement(emb, given, ids)["score"].to_numpy()
    rng = np.random.default_rng(0)
    out = paired_bootstrap(good, rng.random(len(good)), noisy, samples=200)
    assert out["low"] <= out["difference"] <= out["high"] and out["low"] > 0.2


def test_estimated_noise_rate_is_near_the_true_one():
    emb, given, true, ids = clusters(seed=2, noise=0.25)
    probs = detectors.cross_fitted_probabilities(emb, given, 5, 0)
    assert detectors.estimated_noise_rate(probs, given) == pytest.approx((given != true).mean(), abs=0.08)


def test_the_contact_sheet_shows_the_top_suspects_with_every_image_present_and_labels_escaped(tmp_path):
    import re

    from noisydml.audit.sheet import rank_suspects, write_sheet

    emb, given, true, ids = clusters(classes=4, per_class=15)
    audits = {"knn": detectors.knn_disagreement(emb, given, ids),
              "probe": detectors.confident_learning(detectors.cross_fitted_probabilities(emb, given, 3, 0), given,
                                                    ids)}
    suspects = rank_suspects(audits)
    assert suspects["consensus"].is_monotonic_decreasing and len(suspects) == len(ids)
    assert set(suspects.columns) >= {"sample_id", "given_label", "consensus", "agree", "suggested_label",
                                     "score_knn", "score_probe"}
    images = np.random.default_rng(0).integers(0, 256, (len(ids), 8, 8, 3), dtype=np.uint8)
    names = ["<b>cat</b>", "dog & co", "A \"quoted\"", "plain"]
    page = write_sheet(suspects, images, ids, given, names, tmp_path / "sheet", top_n=12)
    text = page.read_text()
    rows = re.findall(r"<tr><td>\d+</td>", text)
    assert len(rows) == 12
    sources = re.findall(r'<img src="([^"]+)"', text)
    assert sources and all((page.parent / s).is_file() for s in sources)
    assert "<b>cat</b>" not in text and ("&lt;b&gt;cat&lt;/b&gt;" in text or "dog &amp; co" in text)
    assert (page.parent / "suspects.csv").is_file()
    # the top suspect is on the page first, its image the first thumbnail of its row
    assert sources[0] == f"thumbs/{suspects['sample_id'].iloc[0]}.png"
