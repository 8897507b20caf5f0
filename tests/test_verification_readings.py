"""insightface's readings of the verification protocols: TAR at FAR as ``eval_ijbc.py`` reads the ROC, VAL at FAR as
``verification.py``'s ``calculate_val`` does, and the network's raw (pre-normalisation) features reaching both."""

import numpy as np
import pytest
import torch

from noisydml.evaluation.verification import tar_at_far, tar_at_far_insightface, val_at_far


def _eval_ijbc_reading(scores, labels, fars):
    """``eval_ijbc.py``'s lines, restated: ``roc_curve``, both arrays flipped ("select largest tpr at same fpr"),
    the minimum of (|fpr - x|, index) tuples."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(labels, scores)
    fpr, tpr = np.flipud(fpr), np.flipud(tpr)
    return [tpr[min(zip(abs(fpr - x), range(len(fpr))))[1]] for x in fars]


def test_the_insightface_reading_is_the_roc_point_nearest_the_far_and_may_lie_above_it():
    """A constructed ROC: 10 impostors at 0.95, 0.85, ..., 0.05 and 5 genuine pairs at 0.99, 0.9, 0.8, 0.41, 0.02.
    Accepting above 0.95 gives FAR 0 and TAR 1/5; above 0.85, FAR 0.1 and TAR 2/5; above 0.75, FAR 0.2 and TAR 3/5.
    At f = 0.17 the strict reading (FAR <= f) takes the FAR-0.1 point, TAR 40 %; insightface's the nearest point,
    FAR 0.2 (0.03 away, against 0.07), TAR 60 %. At f = 0.12 both take FAR 0.1."""
    impostor = np.arange(0.95, 0.0, -0.1)
    genuine = np.array([0.99, 0.9, 0.8, 0.41, 0.02])
    scores = np.concatenate([genuine, impostor])
    labels = np.concatenate([np.ones(5, int), np.zeros(10, int)])
    fars = (0.17, 0.12, 0.0)
    assert tar_at_far_insightface(scores, labels, fars) == pytest.approx([0.6, 0.4, 0.2])
    assert [r.tar for r in tar_at_far(scores, labels, fars)] == pytest.approx([0.4, 0.4, 0.2])
    assert tar_at_far_insightface(scores, labels, fars) == pytest.approx(_eval_ijbc_reading(scores, labels, fars))


def test_the_insightface_reading_equals_eval_ijbcs_lines_on_random_rocs_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(50, 400))
        labels = (rng.random(n) < 0.2).astype(int)
        scores = np.round(rng.normal(labels * 0.8, 0.5), 1)  # rounded: tied scores, repeated FARs
        fars = (1e-3, 1e-2, 0.05, 0.3)
        assert tar_at_far_insightface(scores, labels, fars) == _eval_ijbc_reading(scores, labels, fars)


def _calculate_val_on_a_grid(dist, issame, far_target, thresholds, folds=10):
    """``calculate_val``'s loop, threshold by threshold (the FAR of the 9 folds at each grid point, then linear
    between the grid points around the target), as a reference for the vectorised one."""
    from sklearn.model_selection import KFold

    vals, fars = [], []
    for train, test in KFold(n_splits=folds, shuffle=False).split(dist):
        far_train = np.array([np.logical_and(dist[train] < t, ~issame[train]).sum() / (~issame[train]).sum()
                              for t in thresholds])
        if far_train.max() >= far_target:  # the last grid point below the target, the first at or above it
            below = np.flatnonzero(far_train < far_target)
            above = np.flatnonzero(far_train >= far_target)[0]
            if far_train[above] == far_target or len(below) == 0:
                threshold = thresholds[above]
            else:
                lo = below[-1]
                threshold = thresholds[lo] + (far_target - far_train[lo]) * (thresholds[above] - thresholds[lo]) / (
                    far_train[above] - far_train[lo])
        else:
            threshold = 0.0
        accept = dist[test] < threshold
        vals.append(accept[issame[test]].mean())
        fars.append(accept[~issame[test]].mean())
    return np.mean(vals), np.std(vals), np.mean(fars)


def test_val_at_far_is_calculate_vals_reading():
    rng = np.random.default_rng(1)
    pairs = 600
    issame = np.arange(pairs) % 2 == 0
    a = rng.normal(size=(pairs, 8))
    b = np.where(issame[:, None], a + rng.normal(0, 0.7, (pairs, 8)), rng.normal(size=(pairs, 8)))
    feats = np.empty((2 * pairs, 8))
    feats[0::2], feats[1::2] = a, b
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    dist = np.sum((feats[0::2] - feats[1::2]) ** 2, axis=1)
    grid = np.arange(0.0, 4.0, 0.001)
    for target in (1e-3, 1e-2, 0.1):
        got = val_at_far(feats, issame, target)
        want = _calculate_val_on_a_grid(dist, issame, target, grid)
        assert (got.val, got.val_std, got.far) == pytest.approx(want, abs=1e-12)
    assert 0.0 < val_at_far(feats, issame, 0.1).val < 1.0
    # the last threshold still below the target FAR, not the flat stretch's first (threshold 0): a usable VAL
    assert val_at_far(feats, issame, 1e-3).val > 0.2


def test_verification_features_are_the_networks_output_before_its_normalisation(raw_params):
    """What the train stage keeps for verification is head(backbone(x)), not the unit vector the network returns:
    insightface's flip sum and IJB's norm weighting act on it."""
    from noisydml.config import validate_params
    from noisydml.data.images import InputPipeline
    from noisydml.engine.embedding import embed
    from noisydml.models import build_model
    from noisydml.pipeline.face_features import model_embedder

    params = validate_params(raw_params)
    train_cfg = params["train"]
    torch.manual_seed(0)
    model = build_model(train_cfg, 3)
    images = np.random.default_rng(2).integers(0, 255, (5, 32, 32, 3), dtype=np.uint8)
    raw = model_embedder(model, "embeddings", train_cfg, params["runtime"], seed=0)(images)
    norms = np.linalg.norm(raw, axis=1)
    assert not np.allclose(norms, 1.0)  # not unit vectors
    pipeline = InputPipeline.from_params(train_cfg, params["runtime"], 0, torch.device("cpu"))
    unit = embed(model, images, torch.device("cpu"), pipeline=pipeline).numpy()
    np.testing.assert_allclose(raw / norms[:, None], unit, atol=1e-5)  # the network's directions


def test_the_readings_are_named_alike_wherever_they_are_offered():
    """evaluate.tar_reading's choices, the protocol's and `noisydml verify --tar-reading`'s (a literal there, so its
    --help answers before numpy and pandas) are one list."""
    from noisydml.evaluation import EVALUATE_SCHEMA
    from noisydml.evaluation.verification import TAR_READINGS
    from noisydml.tools import verify_weights

    assert tuple(EVALUATE_SCHEMA["tar_reading"].choices) == TAR_READINGS == verify_weights.TAR_READINGS
