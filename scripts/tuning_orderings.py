"""Tuned against untuned: the orderings of the noise-robust methods against their baselines, per seed (prints tables).

    python scripts/tuning_orderings.py overrides --dataset glyphs       # the `-S` arguments, one per line
    python scripts/tuning_orderings.py run --dataset glyphs [-j 2]      # the launcher with them (in a clone)
    python scripts/tuning_orderings.py table [--repo DIR]               # per-seed P@1 / MAP@R, chosen values, orderings

The experiment (docs/tuning.md "Measured"): on one embedded dataset, at 50% symmetric and 50% small-cluster noise,
3 seeds, every method of the comparisons below trained untuned and tuned with the same budget (tuning.trials), the
chained runs (Smooth Proxy-Anchor's phase 2, SGPS's posterior data clean) tuned by name. Run it in a clone (the
overrides rewrite params.yaml, as `dvc exp run -S` does):

    git clone . /tmp/orderings && cd /tmp/orderings
    python scripts/tuning_orderings.py run --dataset glyphs    # = noisydml launch -j 2 -S ... -S ...
    python scripts/tuning_orderings.py table

`table` reads reports/results_per_seed.csv and tuning/*/*/*/chosen.json of the repository it is given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

#: (paper's method, its baseline, what the comparison is): the issue's orderings, each as runs of one dataset/noise.
COMPARISONS = [
    ("prism", "mcl", "PRISM vs MCL"),
    ("sgps", "prism", "SGPS vs PRISM"),
    ("sgps_posterior", "sgps", "SGPS posterior data clean vs SGPS"),
    ("bspml", "ms_rho1", "BSPML vs MS at rho 1"),
    ("smooth_proxy_anchor", "proxy_anchor_frozen", "Smooth Proxy-Anchor vs Proxy-Anchor, same frozen backbone"),
]
METHODS = ["mcl", "prism", "sgps", "ms_rho1", "bspml", "proxy_anchor_frozen"]
CHAINED = ["smooth_proxy_anchor", "sgps_posterior"]
NOISES = ["sym50", "sc50"]
#: What each dataset needs besides the grid: its own pretraining source, and held-out classes in proportion
#: (glyphs 40 of 200 training classes, as scripts/tune_on_validation.py held out; motifs 20 of 100).
DATASET_SETTINGS = {"glyphs": ["pretrain.source=glyphs", "tuning.validation_classes=40"],
                    "motifs": ["pretrain.source=motifs", "tuning.validation_classes=20"]}


def _chain(name: str, dataset: str, noise: str, method: str, upstream: str, **over) -> str:
    """One entry of ``chains`` in the override grammar (as params.yaml writes the default chains)."""
    body = {"name": name, "dataset": dataset, "noise": noise, "seeds": "grid", "method": method, "upstream": upstream,
            "init": "{model: false, method: false}", "labels": "{label: '', keep: '', kind: label_ids}",
            "inputs": "[]", "hparams": "{}", "train": "{}", **over}
    return "{" + ", ".join(f"{k}: {v}" for k, v in body.items()) + "}"


def overrides(dataset: str) -> list[str]:
    """The `-S` arguments of the experiment on ``dataset`` (applied to the committed params.yaml)."""
    chains = {}
    for noise in NOISES:
        chains[f"smooth_proxy_anchor_{noise}"] = _chain(
            "smooth_proxy_anchor", dataset, noise, "spa_smooth_loss", "spa_confidence",
            inputs="[confidence_classes, confidence_values, confidence_label]")
        # SGPS's posterior data clean, as params.yaml's default chain at sym50 (stage 2 on c^B, stage 3 from it)
        chains[f"sgps_posterior_stage2_{noise}"] = _chain(
            "sgps_posterior_stage2", dataset, noise, "prism", "sgps",
            labels="{label: bottom_up_label, keep: bottom_up_keep, kind: clusters}", hparams="{noise_rate: 0.2}",
            train="{validation_classes: 20, model_selection: best_validation}")
        chains[f"sgps_posterior_{noise}"] = _chain(
            "sgps_posterior", dataset, noise, "sgps", "sgps_posterior_stage2", init="{model: true, method: false}")
    return [f"grid.datasets=[{dataset}]", f"grid.noises=[{','.join(NOISES)}]",
            f"grid.methods=[{','.join(METHODS + ['spa_confidence'])}]", "grid.seeds=[0,1,2]",
            *DATASET_SETTINGS[dataset], f"timing.dataset={dataset}",
            "~chains", "+chains={" + ", ".join(f"{k}: {v}" for k, v in chains.items()) + "}",
            "~figures.bspml_maps", "+figures.bspml_maps={}",
            f"tuning.datasets=[{dataset}]", f"tuning.noises=[{','.join(NOISES)}]",
            f"tuning.methods=[{','.join(METHODS)}]", f"tuning.chains=[{','.join(CHAINED)}]"]


def table(repo: Path) -> None:
    import pandas as pd

    per_seed = pd.read_csv(repo / "reports" / "results_per_seed.csv")
    metrics = ["precision_at_1", "mean_average_precision_at_r"]
    for dataset in sorted(per_seed["dataset"].unique()):
        for noise in NOISES:
            runs = per_seed[(per_seed["dataset"] == dataset) & (per_seed["noise"] == noise)]
            if runs.empty:
                continue
            print(f"\n## {dataset}, {noise}: P@1 / MAP@R (%) per seed\n")
            wide = runs.pivot_table(index="method", columns="seed", values=metrics)
            rows = []
            for name in [*METHODS, *CHAINED]:
                for run in (name, f"{name}_tuned"):
                    if run not in wide.index:
                        continue
                    cells = {f"seed {s}": f"{100 * wide.loc[run, (metrics[0], s)]:.2f} / "
                                          f"{100 * wide.loc[run, (metrics[1], s)]:.2f}"
                             for s in sorted(runs["seed"].unique())}
                    mean = wide.loc[run].groupby(level=0).mean()
                    rows.append({"run": run, **cells, "mean": f"{100 * mean[metrics[0]]:.2f} / "
                                                              f"{100 * mean[metrics[1]]:.2f}"})
            print(pd.DataFrame(rows).to_markdown(index=False))
            print(f"\n### {dataset}, {noise}: orderings (P@1 difference, points; seeds where the method is above)\n")
            lines = []
            for method, baseline, what in COMPARISONS:
                for suffix, kind in (("", "untuned"), ("_tuned", "tuned")):
                    a, b = method + suffix, baseline + suffix
                    if a not in wide.index or b not in wide.index:
                        continue
                    diff = 100 * (wide.loc[a, metrics[0]] - wide.loc[b, metrics[0]])
                    lines.append({"comparison": what, "both": kind, "mean": f"{diff.mean():+.2f}",
                                  "per seed": ", ".join(f"{d:+.2f}" for d in diff),
                                  "above": f"{int((diff > 0).sum())} of {len(diff)}"})
            print(pd.DataFrame(lines).to_markdown(index=False))
            print(f"\n### {dataset}, {noise}: values chosen (tuning/{dataset}/{noise}/*/chosen.json)\n")
            for chosen in sorted((repo / "tuning" / dataset / noise).glob("*/chosen.json")):
                c = json.loads(chosen.read_text())
                first = ", ".join(f"{100 * t['val_precision_at_1']:.2f}" for t in c["first_trials"])
                print(f"- {chosen.parent.name}: {c['values']} (trial {c['trial']} of {c['trials']}, val P@1 "
                      f"{100 * c['val_precision_at_1']:.2f}; first trials {first})")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("overrides", help="print the -S arguments").add_argument(
        "--dataset", required=True, choices=sorted(DATASET_SETTINGS))
    run = sub.add_parser("run", help="the launcher with the overrides, in this repository (it rewrites params.yaml)")
    run.add_argument("--dataset", required=True, choices=sorted(DATASET_SETTINGS))
    run.add_argument("-j", "--jobs", type=int, default=2)
    sub.add_parser("table", help="print the per-seed tables").add_argument("--repo", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    if args.command == "overrides":
        print("\n".join(overrides(args.dataset)))
    elif args.command == "run":
        command = [sys.executable, "-m", "noisydml.tools.launch", "-j", str(args.jobs)]
        for override in overrides(args.dataset):
            command += ["-S", override]
        sys.exit(subprocess.call(command))
    else:
        table(args.repo)


if __name__ == "__main__":
    main(sys.argv[1:])
