"""Estimates of a training set's noise rate (the share of wrong labels) from its embeddings alone: the rate a method
that must be told one (PRISM, SGPS) could be given, and the share a cleaning may act on.

Each estimator reads the cross-fitted probe's out-of-sample probabilities (:func:`~noisydml.audit.detectors.
cross_fitted_probabilities`) or the embeddings' nearest neighbours; none reads the truth.
``scripts/audit_calibration.py`` measures each against the truth across noise kinds and rates
(docs/label-audit.md, "How far the estimates are from the truth").

- ``confident_joint``: cleanlab's ``num_label_issues`` (the confident joint's off-diagonal count) / N;
- ``confident_joint_calibrated``: the same with the joint calibrated to the label counts
  (``estimation_method="off_diagonal_calibrated"``, Confident Learning Eq. 3);
- ``probe_disagreement``: the share of rows whose probe's most probable class is not their label;
- ``expected_error``: the mean probability the probe gives to classes other than the label, 1 - p(given);
- ``loss_mixture``: the weight of the higher-loss component of a two-component Gaussian mixture fitted to the
  rows' loss -log p(given) (DivideMix's split of clean from noisy rows), 0 where the components are not separate
  (Ashman's D <= 2);
- ``knn_majority``: the share of rows whose ``k`` nearest neighbours' most common label is not theirs.
"""

from __future__ import annotations

import numpy as np

ESTIMATORS = ("confident_joint", "confident_joint_calibrated", "probe_disagreement", "expected_error",
              "loss_mixture", "knn_majority")
#: The audit's estimator (ours, chosen by ``scripts/audit_calibration.py`` on the embedded datasets' known noise,
#: never on the data it audits): the smallest error over noise kinds and rates there.
DEFAULT = "loss_mixture"


def from_probability_of_label(p_given: np.ndarray) -> float:
    """:data:`DEFAULT` from each row's out-of-sample probability of its own label (all it needs: a batched probe
    gives it without an N x classes matrix)."""
    return loss_mixture(-np.log(np.maximum(np.asarray(p_given, np.float64), 1e-12)))


#: Ashman's D above which two Gaussian components count as separate populations (Ashman, Bird & Zepf 1994, AJ
#: 108:2348: "D > 2 is required for a clean separation"): the textbook criterion, not fitted here.
SEPARATION = 2.0


def loss_mixture(loss: np.ndarray, seed: int = 0) -> float:
    """The weight of the higher-mean component of a two-component 1-D Gaussian mixture on ``loss``, or 0 when the two
    components are not separate populations (Ashman's D = |mu1 - mu2| / sqrt((s1^2 + s2^2) / 2) at most
    :data:`SEPARATION`): a loss distribution skewed by hard classes alone (clean data) still fits two components, and
    without this the estimate on clean glyphs was 0.31-0.33."""
    from sklearn.mixture import GaussianMixture

    gmm = GaussianMixture(n_components=2, max_iter=100, tol=1e-3, reg_covar=5e-4, random_state=seed)
    gmm.fit(np.asarray(loss, np.float64).reshape(-1, 1))
    means, sds = gmm.means_.ravel(), np.sqrt(gmm.covariances_.ravel())
    separation = abs(means[0] - means[1]) / np.sqrt((sds[0] ** 2 + sds[1] ** 2) / 2)
    return float(gmm.weights_[int(np.argmax(means))]) if separation > SEPARATION else 0.0


def estimates(embeddings: np.ndarray, given: np.ndarray, probs: np.ndarray, k: int = 10) -> dict[str, float]:
    """Every estimator of :data:`ESTIMATORS` on one training set (``given``: labels 0..C-1; ``probs``: the
    cross-fitted probe's ``(N, C)`` probabilities)."""
    from cleanlab.count import num_label_issues

    from noisydml.audit.detectors import majority_label, nearest

    n = len(given)
    p_given = probs[np.arange(n), given].astype(np.float64)
    majority = majority_label(given[nearest(embeddings, k)])
    return {
        "confident_joint": float(num_label_issues(given, probs)) / n,
        "confident_joint_calibrated": float(num_label_issues(
            given, probs, estimation_method="off_diagonal_calibrated")) / n,
        "probe_disagreement": float(np.mean(probs.argmax(1) != given)),
        "expected_error": float(np.mean(1 - p_given)),
        "loss_mixture": from_probability_of_label(p_given),
        "knn_majority": float(np.mean(majority != given)),
    }
