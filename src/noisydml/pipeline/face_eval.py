"""The verification protocols applied to a face run's features (the evaluate stage): what the train stage kept
(:mod:`noisydml.pipeline.face_features`) scored as insightface scores its sets.

- ``.bin`` sets: image + flip features (raw, before the network's normalisation) summed and L2-normalised, the
  10-fold accuracy (:func:`noisydml.evaluation.verification.ten_fold_accuracy`) and VAL at FAR 1e-3
  (:func:`~noisydml.evaluation.verification.val_at_far`);
- the IJB set, as insightface's ``eval_ijbc.py`` runs by default (flip test, feature norms kept, detector score):
  image + flip features summed, *not* normalised, multiplied by the image's detector score, pooled per media
  (mean) and template (sum), normalised, template pairs scored by cosine, TAR at each FAR with the false accepts
  it rests on (``tar_reading``: strict, ours, or insightface's nearest point; both are written), a Wilson interval
  over pairs and the interval that counts, a bootstrap over identities (both of the strict reading).

Verification numbers sit beside the retrieval metrics of the identity-disjoint test split, never instead of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from noisydml import io
from noisydml.data.face_formats import IJBMeta
from noisydml.evaluation.verification import (TAR_READINGS, VERIFICATION_FARS, flip_summed, pair_scores, tar_at_far,
                                              tar_at_far_insightface, tar_interval_over_identities,
                                              template_features, ten_fold_accuracy, val_at_far)


def verification_metrics(saved: dict, prepared_dir: str | Path, tar_reading: str = "strict") -> dict:
    """The protocols' numbers (%) from a run's verification features (``saved``) and, for the IJB set, the meta
    files of the prepared folder: ``<set>_accuracy`` / ``<set>_accuracy_std`` (10 folds), ``<set>_val_at_far`` /
    ``_std`` / ``<set>_val_far`` (VAL at FAR 1e-3 and the FAR it reached), ``tar_at_far_<f>`` (by ``tar_reading``)
    and both readings as ``tar_at_far_<f>_strict`` / ``_insightface``, with the strict reading's ``_low`` /
    ``_high`` (Wilson 95 %, over pairs), ``_identities_low`` / ``_identities_high`` (95 %, a bootstrap over
    identities: the one to read) and ``_false_accepts``."""
    if tar_reading not in TAR_READINGS:
        raise ValueError(f"evaluate.tar_reading: {tar_reading!r}; allowed: {', '.join(TAR_READINGS)}")
    out: dict = {}
    for key in sorted(k for k in saved if k.endswith("_issame")):
        name = key[: -len("_issame")]
        feats = flip_summed(np.asarray(saved[f"{name}_image"], np.float64), np.asarray(saved[f"{name}_flip"]))
        acc = ten_fold_accuracy(feats, saved[key])
        out[f"{name}_accuracy"], out[f"{name}_accuracy_std"] = 100 * acc.mean, 100 * acc.std
        val = val_at_far(feats, saved[key])
        out[f"{name}_val_at_far"], out[f"{name}_val_at_far_std"], out[f"{name}_val_far"] = (
            100 * val.val, 100 * val.val_std, 100 * val.far)
    if "ijb_image" in saved:
        prepared_dir = Path(prepared_dir)
        info = io.read_json(prepared_dir / "info.json")
        meta = IJBMeta.read(prepared_dir / "verification" / "IJB", info.get("ijb_name", "ijbc"))
        feats = np.asarray(saved["ijb_image"], np.float64) + np.asarray(saved["ijb_flip"], np.float64)
        if len(feats) != len(meta.images):
            raise ValueError(f"{len(feats)} IJB features for {len(meta.images)} images of the meta file: the run was "
                             "trained on another version of the dataset; retrain it (dvc repro)")
        feats = feats * meta.images["score"].to_numpy()[:, None]
        ids, templates = template_features(feats, meta.images["template"].to_numpy(), meta.images["media"].to_numpy())
        scores = pair_scores(ids, templates, meta.pairs["template1"].to_numpy(), meta.pairs["template2"].to_numpy())
        pairs = (meta.pairs["label"].to_numpy(), meta.pairs["template1"].to_numpy(), meta.pairs["template2"].to_numpy())
        over_identities = tar_interval_over_identities(scores, *pairs, VERIFICATION_FARS)
        nearest = tar_at_far_insightface(scores, pairs[0], VERIFICATION_FARS)
        for r, near in zip(tar_at_far(scores, pairs[0], VERIFICATION_FARS), nearest):
            key = f"tar_at_far_{r.far:g}"
            out[f"{key}_strict"], out[f"{key}_insightface"] = 100 * r.tar, 100 * near
            out[key] = out[f"{key}_{tar_reading}"]
            out[f"{key}_low"], out[f"{key}_high"] = 100 * r.tar_low, 100 * r.tar_high
            low, high = over_identities[r.far]
            out[f"{key}_identities_low"], out[f"{key}_identities_high"] = 100 * low, 100 * high
            out[f"{key}_false_accepts"] = r.false_accepts
    return out
