"""How far the audit's noise-rate estimates and rankings are from the truth, per run: prints one table per run and
a summary over runs per estimator (error, with a 95 % t interval over the runs).

    python scripts/audit_calibration.py runs/glyphs/*/ms/seed* --csv calibration.csv

Per trained run folder with known noise (the corrupt stage's truth), on the run's training embeddings:

- **rankings** of the cross-fitted probe (the ``confident_learning`` detector's probabilities) by each of
  cleanlab's label-quality scores (``self_confidence``, ``normalized_margin``, ``confidence_weighted_entropy``):
  AUROC and AUPRC;
- **noise-rate estimates** (:data:`noisydml.audit.estimate.ESTIMATORS`), each beside the true rate.

The truth is read to judge, never by an estimator. A benchmark, not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from noisydml.audit import detectors  # noqa: E402 - the package from this checkout
from noisydml.audit.estimate import ESTIMATORS, estimates  # noqa: E402
from noisydml.audit.run import known_noise, truth_of  # noqa: E402

RANKINGS = ("self_confidence", "normalized_margin", "confidence_weighted_entropy")


def calibrate(run: Path, folds: int, k: int) -> dict:
    """One run's row: its setting, the true rate, each ranking's AUROC / AUPRC and each estimate."""
    from cleanlab.rank import get_label_quality_scores
    from sklearn.metrics import average_precision_score, roc_auc_score

    rows = np.load(run / "train_embeddings.npz")
    given, emb, ids = rows["labels"].astype(np.int64), rows["embeddings"], rows["sample_ids"]
    _, dense = np.unique(given, return_inverse=True)
    truth = truth_of(run).loc[ids]
    known = truth.notna().to_numpy()
    noisy = truth[known].astype(bool).to_numpy()
    seed = int(run.name.removeprefix("seed")) if run.name.startswith("seed") else 0
    probs = detectors.cross_fitted_probabilities(emb, dense, folds, seed)
    parts = run.resolve().parts
    out = {"dataset": parts[-4], "noise": parts[-3], "run": parts[-2], "seed": seed, "rows": int(known.sum()),
           "true_rate": float(noisy.mean())}
    for method in RANKINGS:
        score = 1 - get_label_quality_scores(dense, probs, method=method)[known]
        out[f"{method}_auroc"] = float(roc_auc_score(noisy, score)) if 0 < noisy.sum() < len(noisy) else np.nan
        out[f"{method}_auprc"] = float(average_precision_score(noisy, score)) if noisy.any() else np.nan
    out.update(estimates(emb, dense, probs, k))
    return out


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per estimator: the mean error (estimate - truth), its 95 % t interval over the runs, the mean absolute
    error, and the same per noise kind (symmetric / clustered / clean)."""
    from scipy import stats

    rows = []
    kinds = table["noise"].str.extract(r"^([a-z]+)", expand=False)
    for name in ESTIMATORS:
        for kind, part in [("all", table), *table.groupby(kinds)]:
            error = (part[name] - part["true_rate"]).to_numpy()
            half = stats.t.ppf(0.975, len(error) - 1) * error.std(ddof=1) / np.sqrt(len(error)) if len(error) > 1 \
                else np.nan
            rows.append({"estimator": name, "noise": kind, "runs": len(error), "mean_error": error.mean(),
                         "low": error.mean() - half, "high": error.mean() + half,
                         "mean_abs_error": np.abs(error).mean()})
    return pd.DataFrame(rows)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (runs/<dataset>/<noise>/<run>/seed<k>)")
    parser.add_argument("--folds", type=int, default=5, help="folds of the cross-fitted probe (the audit's: 5)")
    parser.add_argument("--k", type=int, default=10, help="neighbours of the kNN estimators (the audit's: 10)")
    parser.add_argument("--csv", type=Path, help="write the per-run table here")
    args = parser.parse_args(argv)
    table = []
    for run in args.runs:
        if not known_noise(truth_of(run)) and not run.resolve().parts[-3] == "clean":
            print(f"{run}: no known noise, skipped")
            continue
        row = calibrate(run, args.folds, args.k)
        table.append(row)
        print(" ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
                       for key, value in row.items()), flush=True)
    table = pd.DataFrame(table)
    if args.csv:
        table.to_csv(args.csv, index=False)
    print("\nrankings (mean over runs):")
    print(table.groupby("noise")[[c for c in table.columns if c.endswith(("_auroc", "_auprc"))]].mean()
          .to_string(float_format="%.3f"))
    print("\nnoise-rate estimates, error = estimate - truth (95 % t interval over runs):")
    print(summary(table).to_string(index=False, float_format="%.3f"))


if __name__ == "__main__":
    main(sys.argv[1:])
