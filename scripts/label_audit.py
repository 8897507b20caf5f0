"""Audit trained runs for wrong labels and judge every detector against the truth; prints one table per run.

    python scripts/label_audit.py runs/glyphs/sym50/prism/seed0 runs/glyphs/sc50/prism/seed0
    python scripts/label_audit.py runs/glyphs/sym50/*/seed0 --csv audit.csv --per-sample suspects/

Per run: the run's own decisions (``method``, where it made any) and the detectors that need no method (cleanlab's
Datalab on the run's training embeddings, confident learning on a cross-fitted probe's probabilities, kNN
disagreement), each judged (AUROC, AUPRC, precision at k = the true number of wrong labels, its flags' precision /
recall / F1, seconds, Python-side peak MiB), and cleanlab's estimate of the noise rate beside the true one. Reads the
run folders only (never the test split). ``--per-sample``: every detector's scores per sample (the audit schema)
as CSV files in that folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from noisydml.audit.run import audit_run, judged_table, truth_of  # noqa: E402 - the package from this checkout
from noisydml.audit.sheet import rank_suspects, write_sheet  # noqa: E402
from noisydml.data.prepared import PreparedDataset  # noqa: E402


def contact_sheet(run: Path, audits: dict, folder: Path, top: int) -> Path:
    """The run's suspects over every detector, with the prepared dataset's images and class names."""
    root = run.resolve().parents[4]
    dataset = run.resolve().parents[2].name
    prepared = PreparedDataset.load(root / "data" / "prepared" / dataset, root)
    rows = np.load(run / "train_embeddings.npz")
    ids = rows["sample_ids"]
    manifest = prepared.manifest.set_index("sample_id")
    names = manifest.groupby("label")["class_name"].first()
    class_names = [str(names.get(c, c)) for c in range(int(manifest["label"].max()) + 1)]
    images = [prepared.images[int(i)] for i in ids]
    return write_sheet(rank_suspects(audits), images, ids, rows["labels"], class_names, folder, top,
                       title=f"Suspected labels: {'/'.join(run.parts[-4:])}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (runs/<dataset>/<noise>/<run>/seed<k>)")
    parser.add_argument("--k", type=int, default=10, help="neighbours of Datalab and kNN disagreement (ours: 10, "
                                                           "cleanlab's default)")
    parser.add_argument("--folds", type=int, default=5, help="folds of the cross-fitted probe (ours: 5)")
    parser.add_argument("--csv", type=Path, help="write every run's judged rows to this CSV")
    parser.add_argument("--per-sample", type=Path, help="a folder for every detector's per-sample scores")
    parser.add_argument("--sheet", type=Path, help="a folder per run for the contact sheet of its suspects "
                                                   "(<folder>/<dataset>-<noise>-<run>-seed<k>/index.html)")
    parser.add_argument("--top", type=int, default=50, help="suspects on a contact sheet")
    args = parser.parse_args(argv)
    tables = []
    for run in args.runs:
        if not (run / "train_embeddings.npz").is_file():
            raise SystemExit(f"{run}: no train_embeddings.npz; give trained run folders (dvc repro first)")
        seed = int(run.name.removeprefix("seed")) if run.name.startswith("seed") else 0
        audits = audit_run(run, args.k, args.folds, seed)
        table = judged_table(audits, truth_of(run))
        table.insert(0, "run", str(run))
        rate = audits["confident_learning"].attrs["estimated_noise_rate"]
        print(f"\n{run}: true noise rate {table['noise_rate'].iloc[0]:.3f}, cleanlab's estimate {rate:.3f}")
        print(table.drop(columns=["run", "rows", "noise_rate"]).to_string(index=False, float_format="%.3f"))
        table["estimated_noise_rate"] = rate
        tables.append(table)
        if args.sheet:
            page = contact_sheet(run, audits, args.sheet / "-".join(run.resolve().parts[-4:]), args.top)
            print(f"contact sheet: {page}")
        if args.per_sample:
            args.per_sample.mkdir(parents=True, exist_ok=True)
            for name, frame in audits.items():
                frame.to_csv(args.per_sample / f"{'-'.join(run.parts[-4:])}-{name}.csv", index=False)
    if args.csv:
        pd.concat(tables).to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")


if __name__ == "__main__":
    main(sys.argv[1:])
