"""The corrupt stage: a prepared dataset + a noise setting -> ``data/noisy/<dataset>/<noise>``.

Two DVC stages run it: ``corrupt@<dataset>-<noise>`` (noise from the data alone, ``grid.noises``) and
``corrupt_from_run@<dataset>-<noise>`` (noise clustered on a run's embeddings, ``noise_runs``), which depends
on that run's folder, so ``dvc dag`` shows the edge and retraining the run re-makes the labels.
"""

from __future__ import annotations

import time

import pandas as pd

from noisydml import io
from noisydml.sections.grid import clusters_a_run
from noisydml.runs import run_name
from noisydml.data.prepared import train_split
from noisydml.noise import NoiseInputs, check_noise, corrupt_labels
from noisydml.noise.features import pixel_features, run_features
from noisydml.pipeline.layout import TRAIN_EMBEDDINGS, Layout
from noisydml.schema import ParamsError


def noise_inputs(dataset: str, ds, train, layout: Layout, feature_run: dict | None = None) -> NoiseInputs:
    """What a noise kind may ask for: features of the training images, and verified-clean flags.

    ``feature_run``: ``{noise, method, seed}`` of the run whose training embeddings ``source: run`` clusters
    (``noise_runs.<dataset>-<noise>.run``)."""

    def features(cfg: dict):
        if cfg["source"] == "pixels":
            if ds.decoded_per_batch:
                raise ValueError(f"{dataset}: features source 'pixels' reads in-memory arrays, and this dataset's "
                                 f"images are {ds.info['storage']}; use features source 'run' (a run's embeddings, "
                                 "as the papers' small-cluster noise does)")
            t0 = time.perf_counter()
            feats = pixel_features(ds.images[train["sample_id"].to_numpy()], cfg["pca_dim"], cfg["pixel_side"],
                                   seed=0)
            print(f"pixel features: PCA to {cfg['pca_dim']} dims in {time.perf_counter() - t0:.1f}s")
            return feats, {"source": "pixels", "pca_dim": cfg["pca_dim"], "pixel_side": cfg["pixel_side"]}
        if feature_run is None:
            raise ValueError("features source 'run' needs the run (noise_runs.<dataset>-<noise>.run)")
        run = run_name(dataset, feature_run["noise"], feature_run["method"], feature_run["seed"])
        path = layout.run(dataset, feature_run["noise"], feature_run["method"], feature_run["seed"]) / TRAIN_EMBEDDINGS
        feats, sha = run_features(path, train["sample_id"].to_numpy(), run)
        return feats, {"source": "run", "run": run, "path": str(path.relative_to(layout.root)), "sha256": sha}

    is_clean = None
    if "is_clean" in train.columns:
        is_clean = pd.to_numeric(train["is_clean"], errors="coerce").to_numpy(dtype=float)
    paths = train["path"].to_numpy() if ds.stored_as_files else None
    return NoiseInputs(features=features, is_clean=is_clean, paths=paths, dataset=dataset)


def corrupt(params: dict, dataset: str, noise: str, layout: Layout = Layout()) -> dict:
    cfg = check_noise(params, noise)
    feature_run = None
    if clusters_a_run(cfg):
        key = f"{dataset}-{noise}"
        if key not in params["noise_runs"]:
            raise ParamsError(f"noise.{noise} clusters a run's embeddings, but noise_runs has no entry {key!r} "
                              "naming the run ({dataset, noise, run: {noise, method, seed}})")
        feature_run = params["noise_runs"][key]["run"]
    ds, train, labels = train_split(layout.prepared(dataset), layout.root)
    names = train.drop_duplicates("label").sort_values("label")["class_name"].tolist()
    inputs = noise_inputs(dataset, ds, train, layout, feature_run)
    table, per_class, stats = corrupt_labels(train["sample_id"].to_numpy(), labels, cfg, inputs, class_names=names)
    if inputs.is_clean is not None:
        # real noise: only verified samples have a known truth (the trainer scores decisions on them alone)
        table["verified"] = (~pd.isna(inputs.is_clean)).astype(int)
    stats = {"dataset": dataset, "noise": noise, **stats}
    with io.atomic_dir(layout.noisy(dataset, noise)) as tmp:
        table.to_csv(tmp / "labels.csv", index=False)
        per_class.to_csv(tmp / "per_class.csv", index=False, float_format="%.6f")
        io.write_json(tmp / "stats.json", stats)
    print(
        f"corrupt {dataset}/{noise}: kind={stats['kind']} nominal rate={stats['nominal_rate']:.3f} "
        f"actual rate={stats['actual_rate']:.3f} ({stats['num_noisy']} of {stats['num_samples']} labels wrong); "
        f"classes {stats['num_classes_before']} -> {stats['num_classes_after']}"
    )
    return stats
