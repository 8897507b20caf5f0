"""Where a paper's method loses to its baseline: SGPS's and Smooth Proxy-Anchor's ablation grids, 3 seeds (prints tables).

    python scripts/method_ablations.py overrides --family sgps --dataset glyphs --noise sym50   # the -S arguments
    python scripts/method_ablations.py run --family sgps --dataset glyphs --noise sym50 [-j 2] # launcher, then save
    python scripts/method_ablations.py table [--results DIR]                                    # per-seed tables
    python scripts/method_ablations.py figure [--results DIR] --out FILE.png                    # SGPS gain vs precision
    python scripts/method_ablations.py summary [--results DIR]                                  # one cell a setting
    python scripts/method_ablations.py weights [--results DIR]                                  # BSPML per epoch

The experiment (docs/ablations.md): on one embedded dataset and noise setting, 3 seeds,

- ``sgps``: PRISM and SGPS (the grid) beside SGPS variants (``figures.sgps_ablations``, one stage per variant and
  seed): positives from c^T or from both c^B and c^T, forwarded positives (the authors' way), and the authors'
  training-loop options (docs/methods/sgps.md), each with its subgroup purity and positive precision;
- ``posterior``: SGPS's posterior data clean (params.yaml's two chained stages) after SGPS, with the bank's
  positives (``--variants bank``) or forwarded ones (``--variants forward``: SGPS and its stage 3 both forward);
- ``spa``: Proxy-Anchor on the frozen backbone, Smooth Proxy-Anchor's phase 1, and phase 2 under every reading of
  its loss that the text allows (chained runs ``spa_<reading>``), with the clean and noisy samples' mean weights;
  the same launch trains BSPML beside MS at rho 1 (the other method that weights samples; same seeds, same batches).

Run it in a clone, with the clone's code on the path (the launcher rewrites params.yaml, as `dvc exp run -S` does):

    git clone . /tmp/ablations && cd /tmp/ablations
    PYTHONPATH=$PWD/src python scripts/method_ablations.py run --family sgps --dataset glyphs --noise sym50

``run`` saves the report's per-seed rows to ``ablations/<family>-<dataset>-<noise>.csv``; ``table`` and ``figure``
read every file there.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

NOISES = ("sym50", "sc50")
#: Each dataset's own pretraining source (docs/datasets.md).
DATASETS = {"glyphs": ["pretrain.source=glyphs"], "motifs": ["pretrain.source=motifs"]}
SEEDS = "[0,1,2]"

#: SGPS variants: name -> (what it tests, methods.sgps overrides). The grid's sgps is the default (bank positives
#: from c^B); "L_noise off" is PRISM by construction (tests/test_sgps.py: gamma 0 trains PRISM bit for bit).
SGPS_VARIANTS = {
    "t_only": ("positives from c^T (Fig. 5a)", {"positives": "top_down"}),
    "both": ("positives from c^B and c^T (Fig. 5a, the paper's)", {"positives": "both"}),
    "forward": ("forwarded positives (the authors' K extra images)", {"positive_source": "forward"}),
    "fwd_select": ("forwarded + selection on queries and on all images, one window (authors' code)",
                   {"positive_source": "forward", "authors": "{selection_on_all: true}"}),
    "fwd_clean2": ("forwarded + selection on all + the clean loss twice (authors' code)",
                   {"positive_source": "forward", "authors": "{selection_on_all: true, clean_loss_on_all: true}"}),
    "fwd_bankfeed": ("forwarded + positives' features into the bank (authors' code)",
                     {"positive_source": "forward", "authors": "{positives_update_bank: true}"}),
    "fwd_authors": ("forwarded + every authors'-code option",
                    {"positive_source": "forward",
                     "authors": "{selection_on_all: true, clean_loss_on_all: true, positives_update_bank: true}"}),
}
#: Smooth Proxy-Anchor phase-2 readings: name -> (what it tests, methods.spa_smooth_loss overrides).
SPA_READINGS = {
    "spa_default": ("params.yaml: per-pair sigmoid weights, negatives weighted by 1 - S", {}),
    "spa_sample": ("one weight per sample, S(max_q c) (the excerpt's 'individual contribution')",
                   {"weighting": "sample"}),
    "spa_neg1": ("negatives unweighted (S- = 1)", {"weight_negatives": "false"}),
    "spa_hard": ("a hard step instead of the sigmoid", {"hard": "true"}),
    "spa_one_sided": ("one-sided smoothing: confident samples keep weight 1", {"smoothing": "one_sided"}),
    "spa_ramp": ("phase 2's weights phased in over its first 6 of 12 epochs", {"ramp_epochs": 6}),
    "spa_tau05": ("relabelling at tau 0.5 (the notes' value) instead of our 0.1: fewer extra positive proxies",
                  {"tau": 0.5}),
}


def _mapping(values: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in values.items()) + "}"


def _spa_chain(name: str, dataset: str, noise: str, hparams: dict) -> str:
    return _mapping({"name": name, "dataset": dataset, "noise": noise, "seeds": "grid", "method": "spa_smooth_loss",
                     "upstream": "spa_confidence", "init": "{model: false, method: false}",
                     "labels": "{label: '', keep: '', kind: label_ids}",
                     "inputs": "[confidence_classes, confidence_values, confidence_label]",
                     "hparams": _mapping(hparams), "train": "{}"})


def overrides(family: str, dataset: str, noise: str, variants: list[str] | None = None) -> list[str]:
    """The `-S` arguments of one (family, dataset, noise) cell of the experiment, on the committed params.yaml."""
    common = [f"grid.datasets=[{dataset}]", f"grid.noises=[{noise}]", f"grid.seeds={SEEDS}", *DATASETS[dataset],
              f"timing.dataset={dataset}", f"timing.noise={noise}", "~figures.bspml_maps", "+figures.bspml_maps={}"]
    if family == "sgps":
        names = variants or list(SGPS_VARIANTS)
        defined = ", ".join(f"{v}: {_mapping({'group': repr('ablation'), 'hparams': _mapping(SGPS_VARIANTS[v][1])})}"
                            for v in names)
        return [*common, "grid.methods=[prism,sgps]", "~chains", "+chains={}",
                f"figures.sgps_ablations.dataset={dataset}", f"figures.sgps_ablations.noise={noise}",
                f"figures.sgps_ablations.seeds={SEEDS}", "~figures.sgps_ablations.variants",
                "+figures.sgps_ablations.variants={" + defined + "}",
                f"figures.sgps_ablations.train=[{','.join(names)}]"]
    if family == "posterior":  # SGPS's posterior data clean (as params.yaml's chains), its positives forwarded
        forward = (variants or ["bank"]) == ["forward"]
        chains = {
            "sgps_posterior_stage2": _mapping({
                "name": "sgps_posterior_stage2", "dataset": dataset, "noise": noise, "seeds": "grid",
                "method": "prism", "upstream": "sgps", "init": "{model: false, method: false}",
                "labels": "{label: bottom_up_label, keep: bottom_up_keep, kind: clusters}", "inputs": "[]",
                "hparams": "{noise_rate: 0.2}", "train": "{validation_classes: 20, model_selection: best_validation}"}),
            "sgps_posterior": _mapping({
                "name": "sgps_posterior", "dataset": dataset, "noise": noise, "seeds": "grid", "method": "sgps",
                "upstream": "sgps_posterior_stage2", "init": "{model: true, method: false}",
                "labels": "{label: '', keep: '', kind: label_ids}", "inputs": "[]", "hparams": "{}", "train": "{}"})}
        return [*common, "grid.methods=[prism,sgps]", *(["methods.sgps.positive_source=forward"] * forward),
                "~chains", "+chains={" + ", ".join(f"{k}: {v}" for k, v in chains.items()) + "}"]
    names = variants or list(SPA_READINGS)
    chains = {name: _spa_chain(name, dataset, noise, SPA_READINGS[name][1]) for name in names}
    return [*common, "grid.methods=[proxy_anchor_frozen,spa_confidence,ms_rho1,bspml]", "~chains",
            "+chains={" + ", ".join(f"{k}: {v}" for k, v in chains.items()) + "}"]


def save(family: str, dataset: str, noise: str, repo: Path) -> Path:
    """Copy the report's per-seed rows (every run of the launch) to ``ablations/``."""
    out = repo / "ablations" / f"{family}-{dataset}-{noise}.csv"
    out.parent.mkdir(exist_ok=True)
    shutil.copyfile(repo / "reports" / "results_per_seed.csv", out)
    for method in ("bspml", "ms_rho1"):  # BSPML's weights epoch by epoch, beside MS at rho 1 on the same batches
        for history in sorted((repo / "runs" / dataset / noise / method).glob("seed*/history.csv")):
            copy = repo / "ablations" / "histories" / f"{dataset}-{noise}-{method}-{history.parent.name}.csv"
            copy.parent.mkdir(exist_ok=True)
            shutil.copyfile(history, copy)
    return out


def _load(results: Path):
    import pandas as pd

    if not sorted(results.glob("*.csv")):
        sys.exit(f"error: no ablation results in {results}/: `run` saves them there; the measured ones of "
                 "docs/ablations.md are in docs/ablations (--results docs/ablations)")
    frames = []
    for path in sorted(results.glob("*.csv")):
        family, _, _ = path.stem.split("-")
        frame = pd.read_csv(path)
        frame["family"] = family
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


#: ``sgps_bank``: the grid's sgps of the launches before forwarded positives became the default (the bank's, from c^B);
#: ``sgps``: the grid's sgps at the default (forwarded positives, as ``sgps_forward``).
SGPS_BASE = {"prism": "PRISM", "sgps_bank": "SGPS, the bank's positives from c^B (the default before)",
             "sgps": "SGPS (the default: forwarded positives from c^B)"}
SPA_BASE = {"proxy_anchor_frozen": "Proxy-Anchor (frozen backbone)"}
BSPML_BASE = {"ms_rho1": "MS at rho 1", "bspml": "BSPML"}
DIAGNOSTICS = {"sgps": [("final_diag_purity_bottom_up", "c^B purity"),
                        ("final_diag_positive_precision", "positive precision"),
                        ("final_diag_anchor_true_positive", "anchors with a true positive")],
               "spa": [("final_diag_weight_clean", "weight clean"), ("final_diag_weight_noisy", "weight noisy")],
               "bspml": [("final_diag_weight_clean", "weight clean"), ("final_diag_weight_noisy", "weight noisy")]}


def _gain(gain) -> str:
    """``mean [95% interval over seeds] verdict``: the paired seed interval of noisydml.reporting.uncertainty (the
    report's); these runs predate the per-class counts, so there is no interval over test classes and the verdict
    is the seeds' alone: above / below where the interval excludes 0, else undecided."""
    from noisydml.reporting import uncertainty

    ci = uncertainty.seed_interval(list(gain))
    if ci is None:
        return f"{gain.mean():+.2f} (one seed)"
    verdict = "above" if ci[0] > 0 else "below" if ci[1] < 0 else "undecided"
    return f"{gain.mean():+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}] {verdict}"


def table(results: Path) -> None:
    import pandas as pd

    rows = _load(results)
    if rows.empty:
        sys.exit(f"no ablation results in {results}")
    blocks = []
    for (family, dataset, noise), group in rows.groupby(["family", "dataset", "noise"], sort=True):
        if family == "sgps":
            blocks.append(("sgps", dataset, noise, group, "prism",
                           {**SGPS_BASE, **{f"sgps_{k}": v[0] for k, v in SGPS_VARIANTS.items()}}))
        else:
            blocks.append(("spa", dataset, noise, group, "proxy_anchor_frozen",
                           {**SPA_BASE, **{k: v[0] for k, v in SPA_READINGS.items()}}))
            blocks.append(("bspml", dataset, noise, group, "ms_rho1", BSPML_BASE))
    for family, dataset, noise, group, baseline, names in blocks:
        if baseline not in set(group["method"]):
            continue
        p1 = group.pivot_table(index="method", columns="seed", values="precision_at_1") * 100
        base = p1.loc[baseline]
        print(f"\n## {family}: {dataset}, {noise} -- P@1 % per seed; gain over {baseline} per seed\n")
        lines = []
        for method, what in names.items():
            if method not in p1.index:
                continue
            seeds = list(p1.columns)
            gain = p1.loc[method] - base
            line = {"run": method, "what": what,
                    **{f"seed {s}": f"{p1.loc[method, s]:.2f}" for s in seeds},
                    "mean": f"{p1.loc[method].mean():.2f}",
                    f"- {baseline} per seed": ", ".join(f"{g:+.2f}" for g in gain),
                    "mean gain [95% interval over seeds]": _gain(gain)}
            for column, label in DIAGNOSTICS[family]:
                if column in group:
                    values = group.loc[group["method"] == method, column]
                    line[label] = f"{values.mean():.3f}" if values.notna().any() else ""
            lines.append(line)
        print(pd.DataFrame(lines).to_markdown(index=False))


def summary(results: Path) -> None:
    """One line per run and one column per (dataset, noise): the mean P@1 gain over the family's baseline, its 95%
    interval over seeds and the verdict it gives (:func:`_gain`), and the diagnostic that explains it (SGPS: positive precision; the weighting methods: the
    clean and noisy samples' mean weights)."""
    import pandas as pd

    rows = _load(results)
    for family, baseline, names, diag in (
            ("sgps", "prism", {**SGPS_BASE, **{f"sgps_{k}": v[0] for k, v in SGPS_VARIANTS.items()}},
             lambda g: f"{g['final_diag_positive_precision'].mean():.2f}"),
            ("spa", "proxy_anchor_frozen", {k: v[0] for k, v in SPA_READINGS.items()},
             lambda g: f"{g['final_diag_weight_clean'].mean():.2f} / {g['final_diag_weight_noisy'].mean():.3f}"),
            ("spa", "ms_rho1", {"bspml": "BSPML"},
             lambda g: f"{g['final_diag_weight_clean'].mean():.2f} / {g['final_diag_weight_noisy'].mean():.2f}"),
            ("posterior", "prism", {"sgps": "SGPS", "sgps_posterior_stage2": "stage 2 (PRISM on c^B)",
                                    "sgps_posterior": "posterior data clean"},
             lambda g: f"{g['final_diag_positive_precision'].mean():.2f}")):
        part = rows[rows["family"] == family]
        if part.empty:
            continue
        table = {}
        for (dataset, noise), group in part.groupby(["dataset", "noise"], sort=True):
            p1 = group.pivot_table(index="method", columns="seed", values="precision_at_1") * 100
            if baseline not in p1.index:
                continue
            for method, what in names.items():
                if method not in p1.index:
                    continue
                gain = p1.loc[method] - p1.loc[baseline]
                runs = group[group["method"] == method]
                table.setdefault((method, what), {})[f"{dataset} {noise}"] = (
                    f"{_gain(gain)} · {diag(runs)}")
        print(f"\n## {family}: P@1 gain over {baseline}, mean [95% interval over seeds] verdict · diagnostic\n")
        print(pd.DataFrame([{"run": m, "what": w, **cells} for (m, w), cells in table.items()]).to_markdown(index=False))


def weights(results: Path) -> None:
    """BSPML's mean weight of the clean and of the noisy samples after each epoch's weight step, per seed, beside
    the test P@1 of BSPML and of MS at rho 1 (trained on the same batches: same seed, same sampler)."""
    import pandas as pd

    histories = sorted((results / "histories").glob("*-bspml-seed*.csv"))
    if not histories:
        sys.exit(f"error: no BSPML histories in {results / 'histories'}/: `run --family spa` saves them there; the "
                 "measured ones are in docs/ablations/histories (--results docs/ablations)")
    for path in histories:
        dataset, noise, _, seed = path.stem.split("-")
        bspml = pd.read_csv(path)
        ms = pd.read_csv(path.with_name(path.name.replace("-bspml-", "-ms_rho1-")))
        table = pd.DataFrame({"epoch": bspml["epoch"], "lambda": bspml["bspml_lambda"],
                              "weight clean": bspml["diag_weight_clean"], "weight noisy": bspml["diag_weight_noisy"],
                              "BSPML P@1": 100 * bspml["test_precision_at_1"],
                              "MS rho 1 P@1": 100 * ms["test_precision_at_1"]})
        print(f"\n## BSPML weights: {dataset}, {noise}, {seed}\n")
        print(table.to_markdown(index=False, floatfmt=".3f"))


def figure(results: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _load(results)
    rows = rows[rows["family"] == "sgps"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    markers = {"glyphs": "o", "motifs": "s"}
    colours = {"sym50": "tab:blue", "sc50": "tab:orange"}
    for (dataset, noise), group in rows.groupby(["dataset", "noise"]):
        prism = group[group["method"] == "prism"].set_index("seed")["precision_at_1"]
        sgps_runs = group[group["method"].str.startswith("sgps")]
        for method, runs in sgps_runs.groupby("method"):
            runs = runs.set_index("seed")
            gain = 100 * (runs["precision_at_1"] - prism.reindex(runs.index)).mean()
            precision = runs["final_diag_positive_precision"].mean()
            ax.scatter(precision, gain, marker=markers.get(dataset, "x"), color=colours.get(noise, "grey"),
                       label=f"{dataset} {noise}")
            ax.annotate(method.removeprefix("sgps_") if method != "sgps" else "forward", (precision, gain),
                        fontsize=7, xytext=(3, 2), textcoords="offset points")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("drawn positives of the anchor's true class (final epoch)")
    ax.set_ylabel("P@1 gain over PRISM (points, mean of 3 seeds)")
    ax.set_title("SGPS variants: gain over PRISM against positive precision")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("overrides", "run"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--family", required=True, choices=("sgps", "spa", "posterior"))
        cmd.add_argument("--dataset", required=True, choices=sorted(DATASETS))
        cmd.add_argument("--noise", required=True, choices=NOISES)
        cmd.add_argument("--variants", default="", help="comma-separated subset of the family's variants")
        if name == "run":
            cmd.add_argument("-j", "--jobs", type=int, default=2)
            cmd.add_argument("--dry", action="store_true", help="the launcher's --dry: list what would run")
            cmd.add_argument("--also", action="append", default=[], metavar="OVERRIDE",
                             help="one more -S after the family's (e.g. 'grid.methods=[prism]' to skip a grid "
                                  "method already measured); repeatable")
    for name in ("table", "summary", "figure", "weights"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--results", type=Path, default=Path("ablations"))
        if name == "figure":
            cmd.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command in ("overrides", "run"):
        chosen = [v for v in args.variants.split(",") if v] or None
        sets = overrides(args.family, args.dataset, args.noise, chosen)
        if args.command == "overrides":
            print("\n".join(sets))
            return
        command = [sys.executable, "-m", "noisydml.tools.launch", "-j", str(args.jobs), *(["--dry"] * args.dry)]
        for override in [*sets, *args.also]:
            command += ["-S", override]
        code = subprocess.call(command)
        if code == 0 and not args.dry:
            print(f"saved {save(args.family, args.dataset, args.noise, Path('.'))}")
        sys.exit(code)
    elif args.command == "table":
        table(args.results)
    elif args.command == "summary":
        summary(args.results)
    elif args.command == "weights":
        weights(args.results)
    else:
        figure(args.results, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
