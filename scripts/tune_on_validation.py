"""Choose settings on held-out *training* classes (never the test set); prints a table.

    # the shared learning rate, for all methods of the grid together
    python scripts/tune_on_validation.py --lrs 0.002 0.001 0.0005 --noise sym50 --validation-classes 40 \
        --workdir /tmp/tune [--set train.pretrained=embedded ...] [--seeds 0]
    # a method's hyper-parameters: each candidate is a comma-separated list of assignments
    python scripts/tune_on_validation.py --noise sympc20 --workdir /tmp/tune_bspml --set 'grid.methods=[bspml]' \
        --candidates methods.bspml.lambda_inf=3.3,methods.bspml.lambda_0=2.7 methods.bspml.lambda_inf=3.6
    # a chained run (trained after its upstream, per seed), scored alone
    python scripts/tune_on_validation.py --noise sym50 --workdir /tmp/tune_spa --set 'grid.methods=[spa_confidence]' \
        --chains smooth_proxy_anchor_clean --score smooth_proxy_anchor --candidates methods.spa_smooth_loss.tau=0.2

Every method of params.yaml's ``grid.methods`` (or ``--set grid.methods=[...]``) trains on ``--noise``'s
labels of the grid's first dataset with ``train.validation_classes`` training classes held out (by noisy
label: all a practitioner has); the score of a candidate is the validation P@1 of the last epoch, averaged
over the methods (one shared setting, never per method). The test set is never read for the choice (its P@1 is printed beside, for the
record only). Runs go to ``--workdir`` (outside the repository's DVC outputs); the MLflow runs to
``--workdir/mlflow.db``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import shutil

import pandas as pd
import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--lrs", type=float, nargs="+", default=[], help="shorthand: candidates train.optimizer.lr=x")
    parser.add_argument("--candidates", nargs="+", default=[], help="each: key.path=value[,key.path=value...]")
    parser.add_argument("--noise", default="sym50")
    parser.add_argument("--validation-classes", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--set", action="append", default=[], help="a `dvc exp run -S` argument, applied by DVC's own code before tuning")
    parser.add_argument("--chains", nargs="+", default=[],
                        help="keys of params.yaml's chains to train too (after their upstreams; on --noise, per seed)")
    parser.add_argument("--score", nargs="+", default=[],
                        help="run names the choice is scored on (default: every method and chain trained)")
    args = parser.parse_args()

    from dvc.utils.hydra import apply_overrides

    from noisydml.config import read_params_file

    args.workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.params, args.workdir / "params.yaml")
    apply_overrides(args.workdir / "params.yaml", args.set)  # as `dvc exp run -S` applies them
    raw = read_params_file(args.workdir / "params.yaml")
    raw["train"].update(validation_classes=args.validation_classes, model_selection="last")
    missing = [key for key in args.chains if key not in raw["chains"]]
    if missing:
        parser.error(f"--chains: {missing} not in params.yaml's chains ({', '.join(raw['chains'])})")
    raw["grid"]["seeds"] = list(args.seeds)
    raw["grid"]["noises"] = [args.noise]
    raw["chains"] = {key: {**raw["chains"][key], "noise": args.noise, "seeds": "grid"} for key in args.chains}
    raw["timing"]["entries"] = {}
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{args.workdir.resolve() / 'mlflow.db'}")

    from noisydml.tools.check import validate_all
    from noisydml.pipeline.corrupt import corrupt
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.prepare import prepare
    from noisydml.pipeline.pretrain import pretrain
    from noisydml.pipeline.train import train
    from noisydml.runs import runs_of

    base = validate_all(raw)
    dataset = base["grid"]["datasets"][0]
    shared = Layout(args.workdir / "shared")
    if not (shared.prepared(dataset) / "manifest.csv").exists():
        prepare(base, dataset, shared)
    if not (shared.noisy(dataset, args.noise) / "labels.csv").exists():
        corrupt(base, dataset, args.noise, shared)
    if base["train"]["pretrained"] == "embedded" and not (shared.pretrained / "card.json").exists():
        pretrain(base, shared)

    candidates = [f"train.optimizer.lr={lr:g}" for lr in args.lrs] + args.candidates
    if not candidates:
        parser.error("give --lrs or --candidates")
    rows = []
    for number, candidate in enumerate(candidates):
        root = args.workdir / (f"lr{args.lrs[number]:g}" if number < len(args.lrs) else f"candidate{number}")
        root.mkdir(parents=True, exist_ok=True)
        (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        apply_overrides(root / "params.yaml", candidate.split(","))  # each a `dvc exp run -S` argument
        params = validate_all(read_params_file(root / "params.yaml"))
        layout = Layout(root)
        (root / "data").mkdir(parents=True, exist_ok=True)
        for part in ("prepared", "noisy", "pretrained"):
            link = root / "data" / part
            if not link.exists() and (shared.root / "data" / part).exists():
                link.symlink_to((shared.root / "data" / part).resolve())
        pending = runs_of(params)  # the grid's runs, then the chains' (a chain after its upstream)
        while pending:
            ready = [r for r in pending if r.chain is None or not any(
                (u.dataset, u.noise, u.name, u.seed) == (r.dataset, r.noise, r.chain["upstream"], r.seed) for u in pending)]
            for run in ready:
                folder = layout.root / run.folder
                if not (folder / "history.csv").exists():
                    train(params, run, layout)
                last = pd.read_csv(folder / "history.csv").iloc[-1]
                rows.append({"candidate": candidate, "method": run.name, "seed": run.seed,
                             "val_p_at_1": last["val_precision_at_1"],
                             "test_p_at_1 (not used)": last["test_precision_at_1"]})
            pending = [r for r in pending if r not in ready]
    table = pd.DataFrame(rows)
    if args.score:
        table = table[table["method"].isin(args.score)]
    pd.set_option("display.width", 200)
    print(table.pivot_table(index="method", columns="candidate", values="val_p_at_1").round(4).to_string())
    score = table.groupby("candidate")[["val_p_at_1", "test_p_at_1 (not used)"]].mean().round(4)
    print(score.to_string())
    print(f"chosen (highest mean validation P@1 over methods): {score['val_p_at_1'].idxmax()}")


if __name__ == "__main__":
    main()
