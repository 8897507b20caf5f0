"""Audit trained runs for wrong labels and judge every detector against the truth; prints one table per run.

    python scripts/label_audit.py runs/glyphs/sym50/prism/seed0 runs/glyphs/sc50/prism/seed0
    python scripts/label_audit.py runs/glyphs/sym50/*/seed0 --csv audit.csv --per-sample suspects/
    python scripts/label_audit.py runs/mine/clean/prism/seed0 --clean-csv mine-cleaned.csv --action relabel

Per run: the run's own decisions (``method``, where it made any) and the detectors that need no method (cleanlab's
Datalab on the run's training embeddings, confident learning on a cross-fitted probe's probabilities, kNN
disagreement), each judged (AUROC, AUPRC, precision at k = the true number of wrong labels, its flags' precision /
recall / F1, seconds, Python-side peak MiB), and the audit's estimate of the noise rate beside the true one; on data
without known wrong labels (a ``folder`` dataset of your own) nothing is judged and the estimate is printed alone.
Reads the run folders and the corrupt stage's label tables only (never the test split). ``--per-sample``: every
detector's scores per sample (the audit schema) as CSV files in that folder. ``--clean-csv``: a ``folder``
dataset's listing with the suspected training labels dropped or relabelled (:mod:`noisydml.audit.clean`), to
train on as ``datasets.<name>.csv`` (README "Find the wrong labels in your data").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from noisydml.audit.clean import (MAX_SHARE, MIN_OVERLAP, RULES, CleaningRefused, cleaned_listing,  # noqa: E402
                                  plan)
from noisydml.audit.detectors import CENTROID_TEMPERATURE  # noqa: E402
from noisydml.audit.run import (DEFAULT_DETECTORS, DETECTORS, audit_run, estimated_rate,  # noqa: E402
                                judged_table, known_noise, training_class_names, truth_of)
from noisydml.audit.sheet import rank_suspects  # noqa: E402
from noisydml.config import load_params  # noqa: E402
from noisydml.data.prepared import PreparedDataset  # noqa: E402
from noisydml.pipeline.audit import contact_sheet  # noqa: E402


def prepared_of(run: Path) -> tuple[Path, str, PreparedDataset]:
    """The repository root, the dataset's name and its prepared dataset, from a run folder."""
    root = run.resolve().parents[4]
    dataset = run.resolve().parents[2].name
    return root, dataset, PreparedDataset.load(root / "data" / "prepared" / dataset, root)


def clean_listing(run: Path, located: tuple[Path, str, PreparedDataset], audits: dict, rate: float, out_csv: Path,
                  args: argparse.Namespace) -> dict:
    """The ``folder`` dataset's listing with the suspects of ``audits`` (one or several runs' detectors; ``rate``:
    their median estimate of the noise rate, which one failed run does not move) acted on
    (:func:`~noisydml.audit.clean.plan`; params.yaml's ``datasets.<name>``; ``located``: :func:`prepared_of` a run);
    prints what it did, its warnings and the retrain's settings."""
    root, dataset, prepared = located
    cfg = load_params(root / "params.yaml", ("datasets",))["datasets"][dataset]
    if cfg.get("kind") != "folder":
        raise SystemExit(f"--clean-csv: dataset {dataset!r} is kind {cfg.get('kind')!r}; a cleaned listing is written "
                         "for folder datasets (their csv form reads it back)")
    suspects = rank_suspects(audits)
    try:
        acted, facts = plan(suspects, audits, rate, args.action, args.rule, args.min_agree, args.max_share,
                            args.min_overlap, args.force)
    except CleaningRefused as refused:
        raise SystemExit(f"--clean-csv: not written: {refused}") from None
    before = out_csv.read_bytes() if out_csv.is_file() else None
    done = cleaned_listing(cfg, root, prepared.manifest, training_class_names(run), suspects, acted, out_csv)
    print(f"cleaned listing: {out_csv}: rule {args.rule}, action {args.action}; acted on {len(acted)} of "
          f"{done['training_rows']} training rows ({facts['acted_share']:.1%}; estimated noise rate {rate:.1%}): "
          f"{done['dropped']} dropped, {done['relabelled']} relabelled, {done['dropped_single_left']} dropped as the "
          f"last of their class")
    for warning in facts["warnings"]:
        print(f"WARNING (--force): {warning}")
    if before is not None and before != out_csv.read_bytes():
        # DVC tracks a folder dataset's params (the csv's name), not the listing's content: a dataset that already
        # names this file would keep its prepared data, and DVC's run cache would serve it again
        print(f"WARNING: {out_csv} held another listing, now replaced. DVC sees a folder dataset's params, not its "
              f"files: a dataset that already names {out_csv.name} keeps its old prepared data. Retrain from a new "
              f"file name (e.g. {out_csv.stem}-2{out_csv.suffix}, named in datasets.<name>.csv)")
    if done["emptied"]:
        print(f"WARNING: {len(done['emptied'])} training classes lost every row: {', '.join(done['emptied'][:10])}"
              f"{' ...' if len(done['emptied']) > 10 else ''}")
    kept = done["training_rows_written"]
    residual = max(rate * done["training_rows"] - len(acted), 0) / max(kept, 1)
    print(f"retrain: at least {residual:.1%} of the kept rows are still estimated wrong (the estimate less the rows "
          f"acted on; more where some of those were right); a method told a noise rate takes at least that (e.g. "
          f"-S methods.prism.noise_rate={residual:.2f}), and "
          f"{done['training_rows'] / max(kept, 1):.2f} x train.epochs keeps the steps of the audited run")
    return done


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (runs/<dataset>/<noise>/<run>/seed<k>)")
    parser.add_argument("--k", type=int, default=10, help="neighbours of Datalab and kNN disagreement (ours: 10, "
                                                           "cleanlab's default)")
    parser.add_argument("--detectors", default=",".join(DEFAULT_DETECTORS),
                        help=f"comma-separated, of {', '.join(DETECTORS)} (knn_confident_learning, "
                             "centroid_confident_learning: batched confident learning for a benchmark's scale)")
    parser.add_argument("--folds", type=int, default=5, help="folds of the cross-fitted probes (ours: 5)")
    parser.add_argument("--temperature", type=float, default=CENTROID_TEMPERATURE,
                        help=f"softmax temperature of centroid_confident_learning's probe (ours: {CENTROID_TEMPERATURE})")
    parser.add_argument("--csv", type=Path, help="write every run's judged rows to this CSV")
    parser.add_argument("--per-sample", type=Path, help="a folder for every detector's per-sample scores")
    parser.add_argument("--sheet", type=Path, help="a folder per run for the contact sheet of its suspects "
                                                   "(<folder>/<dataset>-<noise>-<run>-seed<k>/index.html)")
    parser.add_argument("--top", type=int, default=50, help="suspects on a contact sheet")
    parser.add_argument("--clean-csv", type=Path, help="write the folder dataset's listing with the suspected training "
                                                       "labels acted on (the consensus of every run given: runs of "
                                                       "one dataset and noise, e.g. its seeds)")
    parser.add_argument("--action", choices=("drop", "relabel"), default="drop",
                        help="drop the suspected rows, or give them the suggested label (dropped without one)")
    parser.add_argument("--rule", choices=RULES, default="estimate",
                        help="which rows to act on: estimate (the default: as many as the estimated noise rate, "
                             "most suspected first) or agree (those --min-agree detectors flag)")
    parser.add_argument("--min-agree", type=int, default=2, help="with --rule agree: a row is suspected when at "
                                                                 "least this many detectors flag it (ours: 2)")
    parser.add_argument("--max-share", type=float, default=MAX_SHARE,
                        help=f"refuse to act on more than this share of the training rows (ours: {MAX_SHARE})")
    parser.add_argument("--min-overlap", type=float, default=MIN_OVERLAP,
                        help="refuse when two detectors' top sets overlap less than this (ours: "
                             f"{MIN_OVERLAP})")
    parser.add_argument("--force", action="store_true", help="write the cleaned listing despite a refusal")
    args = parser.parse_args(argv)
    if args.clean_csv and len({run.resolve().parents[1] for run in args.runs}) != 1:
        raise SystemExit("--clean-csv acts on the runs of one dataset and noise (their seeds or methods: the consensus "
                         "over all of them); runs of several given")
    tables, every, rates = [], {}, []
    for run in args.runs:
        if not (run / "train_embeddings.npz").is_file():
            raise SystemExit(f"{run}: no train_embeddings.npz; give trained run folders (dvc repro first)")
        seed = int(run.name.removeprefix("seed")) if run.name.startswith("seed") else 0
        audits = audit_run(run, args.k, args.folds, seed, tuple(args.detectors.split(",")), args.temperature)
        rate = estimated_rate(audits)
        truth = truth_of(run)
        if not known_noise(truth):
            print(f"\n{run}: estimated noise rate {rate:.3f}; no label is known to be wrong (a clean setting, or data "
                  "whose truth nobody recorded): nothing judged")
        else:
            table = judged_table(audits, truth)
            table.insert(0, "run", str(run))
            print(f"\n{run}: true noise rate {table['noise_rate'].iloc[0]:.3f}, estimated {rate:.3f}")
            print(table.drop(columns=["run", "rows", "noise_rate"]).to_string(index=False, float_format="%.3f"))
            tables.append(table)
        if args.sheet:
            page = contact_sheet(run, prepared_of(run)[2], audits, args.sheet / "-".join(run.resolve().parts[-4:]),
                                 args.top, f"Suspected labels: {'/'.join(run.parts[-4:])}")
            print(f"contact sheet: {page}")
        if args.per_sample:
            args.per_sample.mkdir(parents=True, exist_ok=True)
            for name, frame in audits.items():
                frame.to_csv(args.per_sample / f"{'-'.join(run.parts[-4:])}-{name}.csv", index=False)
        if args.clean_csv:  # the consensus over every run given: seeds vote together
            every.update({f"{'-'.join(run.parts[-2:])}/{name}": frame for name, frame in audits.items()})
            rates.append(rate)
    if args.clean_csv:
        # the median, not the mean: one run whose probe failed (measured: a 128-row folder dataset, one seed's
        # estimate 0.91 against 0.14 and 0.14 for the other two, truth 0.19) would otherwise set the share
        clean_listing(args.runs[0], prepared_of(args.runs[0]), every, float(np.median(rates)), args.clean_csv, args)
    if args.csv and tables:
        pd.concat(tables).to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")


if __name__ == "__main__":
    main(sys.argv[1:])
