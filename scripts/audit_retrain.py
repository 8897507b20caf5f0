"""Does cleaning with the audit help? Retrain on the cleaned listing, on the noisy data and on oracle cleaning, and
compare held-out retrieval: prints the per-seed table and writes
``references/label_audit/retrain_<dataset>{.csv,.json,_summary.csv}``.

    python scripts/audit_retrain.py /tmp/audit_retrain --dataset glyphs --noises sym20 sym50 sc10 sc25
    python scripts/audit_retrain.py /tmp/audit_retrain --source <checkout> --dataset motifs --set pretrain.source=motifs
    python scripts/audit_retrain.py /tmp/audit_retrain --collect        # only collect a finished study

As a practitioner runs it (README "Find the wrong labels in your data"), on ``folder`` datasets built here from an
embedded dataset with known injected noise: per noise setting, the training images carry the noisy labels (the
corrupt stage's, read from ``--source``: a checkout where ``corrupt@<dataset>-<noise>`` ran) and ``is_clean`` = the
truth, the test rows as prepared. In a scratch clone (its DVC cache that of this checkout):

1. train ``--method`` at ``--seeds`` on the noisy listing (``<dataset>_<noise>_noisy``) and on oracle cleaning
   (``..._oracle``: exactly the wrong training rows dropped);
2. audit the noisy runs (``scripts/label_audit.py`` on all seeds: their consensus) and write the cleaned listing with
   the default rule; when the audit refuses, that refusal is the outcome (the user keeps the noisy data: P@1 as
   noisy) and the listing it would have written with ``--force`` is trained too, to show what the refusal avoided;
3. train on the cleaned listing (``..._cleaned``; ``..._relabelled`` with ``--action relabel``);
4. collect P@1 and MAP@R of each and the cleaning's precision / recall against the truth.

Each variant trains with the same ``train`` section (epochs as passes over the listing it is given). Ground truth
builds the oracle listing and judges; the audit never reads it. A study, not a test: minutes per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from noisydml.audit.run import training_class_names  # noqa: E402 - the package from this checkout
from noisydml.data.prepared import PreparedDataset  # noqa: E402
from noisydml.reporting.uncertainty import seed_interval  # noqa: E402

OUT = REPO / "references" / "label_audit"
VARIANTS = ("noisy", "cleaned", "oracle")
#: The cleaned listing's file and dataset suffix per --action. Distinct names, not one file rewritten: DVC sees a
#: folder dataset's params, not its files' content, so a relabelled listing written where a dropped one was would
#: be served the dropped one's prepared data from DVC's run cache.
CLEANED = {"drop": "cleaned", "relabel": "relabelled"}


def build(source: Path, dataset: str, noise: str, folder: Path) -> dict:
    """``folder/images/<sample>.png``, ``noisy.csv`` (the folder kind's listing: ``path,label,split,is_clean``;
    training rows under their noisy label, ``is_clean`` the truth), ``oracle.csv`` (its wrong training rows
    dropped, and a training class left with one row) and ``truth.csv`` (every training row's true class, to judge
    relabelling; no listing names it, so no stage reads it). Returns the counts."""
    from PIL import Image

    prepared = PreparedDataset.load(source / "data" / "prepared" / dataset, source)
    noisy_dir = source / "data" / "noisy" / dataset / noise
    if not (noisy_dir / "labels.csv").is_file():
        raise SystemExit(f"{noisy_dir / 'labels.csv'}: missing; run `dvc repro corrupt@{dataset}-{noise}` in "
                         f"{source} (the noise defined in its params.yaml)")
    labels = pd.read_csv(noisy_dir / "labels.csv").set_index("sample_id")
    names = training_class_names(source / "runs" / dataset / noise / "x" / "seed0")  # reads the noise folder only
    manifest = prepared.manifest
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for sample, split, class_name in zip(manifest["sample_id"], manifest["split"], manifest["class_name"]):
        path = folder / "images" / f"{sample}.png"
        if not path.exists():
            image = np.asarray(prepared.images[int(sample)])
            Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(path)
        if split == "train":
            label, clean = names.loc[int(labels.at[sample, "label"])], 1 - int(labels.at[sample, "is_noisy"])
        else:
            label, clean = class_name, 1
        rows.append({"path": f"images/{sample}.png", "label": label, "split": split, "is_clean": clean,
                     "true_class": class_name})
    listing = pd.DataFrame(rows)
    listing.loc[listing["split"] == "train", ["path", "true_class"]].to_csv(folder / "truth.csv", index=False)
    listing = listing.drop(columns="true_class")
    listing.to_csv(folder / "noisy.csv", index=False)
    oracle = listing[~((listing["split"] == "train") & (listing["is_clean"] == 0))]
    counts = oracle[oracle["split"] == "train"].groupby("label").size()
    oracle = oracle[~((oracle["split"] == "train") & oracle["label"].isin(counts[counts < 2].index))]
    oracle.to_csv(folder / "oracle.csv", index=False)
    train = listing["split"] == "train"
    return {"training_rows": int(train.sum()), "wrong": int((listing.loc[train, "is_clean"] == 0).sum()),
            "oracle_training_rows": int((oracle["split"] == "train").sum())}


def dataset_override(name: str, csv: str, image: np.ndarray) -> str:
    channels = 1 if image.ndim == 2 or image.shape[-1] == 1 else 3
    return f"+datasets.{name}={{kind: folder, csv: {csv}, image_size: {image.shape[0]}, channels: {channels}}}"


def launch(work: Path, datasets: dict[str, str], method: str, seeds: list[int], image: np.ndarray,
           extra: list[str]) -> None:
    """Train ``method`` at ``seeds`` on each folder dataset (name -> listing csv, relative to ``work``); ``extra``:
    more ``-S`` overrides (``--set``: e.g. the dataset's own pretraining)."""
    names = list(datasets)
    sets = [*(dataset_override(name, csv, image) for name, csv in datasets.items()),
            f"grid.datasets=[{','.join(names)}]", "grid.noises=[clean]", f"grid.methods=[{method}]",
            f"grid.seeds=[{','.join(map(str, seeds))}]", f"timing.dataset={names[0]}", "timing.noise=clean",
            "~chains", "+chains={}", "~figures.bspml_maps", "+figures.bspml_maps={}", *extra]
    command = ["noisydml", "launch", "-j", "2", "--quiet-epochs", *[p for s in sets for p in ("-S", s)]]
    subprocess.run(["git", "checkout", "-q", "params.yaml"], cwd=work, check=True)
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=work, check=True, env={**os.environ, "PYTHONPATH": str(work / "src")})


def audit(work: Path, name: str, method: str, seeds: list[int], folder: Path, action: str) -> dict:
    """The audit of the noisy runs (every seed's, their consensus) -> ``folder/<CLEANED[action]>.csv``: the default
    rule with ``action``, or, where it refuses, the listing ``--force`` writes (the refusal kept)."""
    runs = [str(Path("runs") / name / "clean" / method / f"seed{s}") for s in seeds]
    command = [sys.executable, "scripts/label_audit.py", *runs, "--clean-csv", str(folder / f"{CLEANED[action]}.csv"),
               "--action", action]
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, env=env)
    print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
    refused = done.returncode != 0 and "not written" in done.stderr
    if done.returncode != 0 and not refused:
        raise SystemExit(f"the audit of {name} failed (exit {done.returncode})")
    if refused:
        forced = subprocess.run([*command, "--force"], cwd=work, capture_output=True, text=True, env=env, check=True)
        print(forced.stdout[-2000:], flush=True)
    return {"refused": refused, "refusal": done.stderr.strip().splitlines()[-1] if refused else ""}


def cleaning_quality(folder: Path, action: str = "drop") -> dict:
    """The cleaned listing's training rows against the truth: rows acted on (dropped or relabelled), their
    precision and recall; of the relabelled, how many got their true class; the wrong labels left."""
    noisy = pd.read_csv(folder / "noisy.csv")
    truth = pd.read_csv(folder / "truth.csv").set_index("path")["true_class"]
    cleaned = pd.read_csv(folder / f"{CLEANED[action]}.csv")
    train = noisy[noisy["split"] == "train"].set_index("path")
    after = cleaned[cleaned["split"] == "train"]
    after = after.set_index(after["path"].map(lambda p: "images/" + Path(p).name))["label"]  # path -> label kept
    dropped = ~train.index.isin(after.index)
    relabelled = ~dropped & (after.reindex(train.index) != train["label"]).to_numpy()
    acted = dropped | relabelled
    wrong = (train["is_clean"] == 0).to_numpy()
    right_after = after == truth.reindex(after.index)  # per kept row: its label now the true class
    return {"acted": int(acted.sum()), "acted_share": float(acted.mean()),
            "precision": float((acted & wrong).sum() / max(acted.sum(), 1)),
            "recall": float((acted & wrong).sum() / max(wrong.sum(), 1)),
            "dropped": int(dropped.sum()), "relabelled": int(relabelled.sum()),
            "relabelled_right": int(right_after.loc[train.index[relabelled]].sum()),
            "wrong_left": int((~right_after).sum()), "wrong_left_share": float((~right_after).mean())}


def collect(work: Path, plan: dict, method: str, seeds: list[int], action: str = "drop") -> pd.DataFrame:
    rows = []
    for noise, info in plan.items():
        for variant in VARIANTS:
            dataset = f"{info['name']}_{CLEANED[action] if variant == 'cleaned' else variant}"
            for seed in seeds:
                path = work / "metrics" / dataset / "clean" / method / f"seed{seed}.json"
                metrics = json.loads(path.read_text())["metrics"]
                rows.append({"noise": noise, "variant": variant, "seed": seed,
                             "p_at_1": 100 * metrics["precision_at_1"],
                             "map_at_r": 100 * metrics["mean_average_precision_at_r"]})
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame, plan: dict) -> pd.DataFrame:
    """Per noise: the mean P@1 of each variant, cleaned - noisy and oracle - noisy with their 95 % t interval over
    the seeds (paired by seed), the verdict the user gets (a refused cleaning keeps the noisy data)."""
    out = []
    for noise, part in table.groupby("noise", sort=False):
        wide = part.pivot(index="seed", columns="variant", values="p_at_1")
        row = {"noise": noise, **{f"{v}_p_at_1": wide[v].mean() for v in VARIANTS}, **plan[noise]["quality"],
               "refused": plan[noise]["refused"]}
        for variant in ("cleaned", "oracle"):
            diff = (wide[variant] - wide["noisy"]).to_numpy()
            ci = seed_interval(diff)
            row.update({f"{variant}_minus_noisy": diff.mean(), f"{variant}_low": ci[0] if ci else np.nan,
                        f"{variant}_high": ci[1] if ci else np.nan})
        out.append(row)
    return pd.DataFrame(out)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path, help="a scratch folder for the clone (re-made unless --collect)")
    parser.add_argument("--source", type=Path, default=REPO, help="a checkout whose corrupt stages ran for the noises")
    parser.add_argument("--dataset", default="glyphs")
    parser.add_argument("--noises", nargs="+", default=["sym20", "sym50", "sc10", "sc25"])
    parser.add_argument("--method", default="ms")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--action", choices=("drop", "relabel"), default="drop",
                        help="the audit's --action for the cleaned listing (the README's default: drop)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a further -S override of every launch (repeatable): motifs trains from its own "
                             "pretraining, --set pretrain.source=motifs, as params.yaml says")
    parser.add_argument("--collect", action="store_true", help="only collect a finished study in workdir")
    args = parser.parse_args(argv)
    work = args.workdir
    plan = {noise: {"name": f"{args.dataset}_{noise}"} for noise in args.noises}
    state = work / "audit_retrain.json"
    if not args.collect:
        subprocess.run(["rm", "-rf", str(work)], check=True)
        subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
        subprocess.run(["dvc", "cache", "dir", str(REPO / ".dvc" / "cache")], cwd=work, check=True)
        for noise, info in plan.items():
            info["counts"] = build(args.source, args.dataset, noise, work / "folders" / info["name"])
            print(f"built {info['name']}: {info['counts']}", flush=True)
        image = np.asarray(PreparedDataset.load(args.source / "data" / "prepared" / args.dataset,
                                                args.source).images[0])
        listings = {f"{i['name']}_{v}": f"folders/{i['name']}/{v}.csv" for i in plan.values() for v in ("noisy",
                                                                                                      "oracle")}
        launch(work, listings, args.method, args.seeds, image, args.set)
        for noise, info in plan.items():
            info.update(audit(work, f"{info['name']}_noisy", args.method, args.seeds, work / "folders" / info["name"],
                              args.action))
            info["quality"] = cleaning_quality(work / "folders" / info["name"], args.action)
        cleaned = CLEANED[args.action]
        launch(work, {**listings, **{f"{i['name']}_{cleaned}": f"folders/{i['name']}/{cleaned}.csv"
                                     for i in plan.values()}}, args.method, args.seeds, image, args.set)
        state.write_text(json.dumps(plan, indent=1))
    plan = json.loads(state.read_text())
    table = collect(work, plan, args.method, args.seeds, args.action)
    print(table.pivot_table(index=["noise", "seed"], columns="variant", values="p_at_1").to_string(
        float_format="%.2f"))
    sums = summary(table, plan)
    print(sums.to_string(index=False, float_format="%.3f"))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, capture_output=True, text=True,
                            check=True).stdout.strip()
    stem = f"retrain_{args.dataset}" + ("_relabel" if args.action == "relabel" else "")
    out = OUT / stem
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False, float_format="%.4f")
    sums.to_csv(OUT / f"{stem}_summary.csv", index=False, float_format="%.4f")
    from face_table4 import cpu_name  # noqa: PLC0415 - the same CPU naming as the other studies

    out.with_suffix(".json").write_text(json.dumps({"commit": commit, "cpu": cpu_name(), "dataset": args.dataset,
                                                    "method": args.method, "seeds": args.seeds, "set": args.set,
                                                    "action": args.action,
                                                    "plan": plan}, indent=1))
    print(f"wrote {out.with_suffix('.csv')}")


if __name__ == "__main__":
    main(sys.argv[1:])
