"""What each DVC stage does, as functions of validated params and paths.

``stages/*.py`` only parse arguments and call these. Paths follow one layout
(:class:`Layout`) so dvc.yaml, the stages and the report agree on where
things are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from noisydml import io
from noisydml.config import run_name

#: A run's embeddings of its training images (sample ids beside them).
TRAIN_EMBEDDINGS = "train_embeddings.npz"


@dataclass(frozen=True)
class Layout:
    root: Path = Path(".")

    def prepared(self, dataset: str) -> Path:
        return self.root / "data" / "prepared" / dataset

    def noisy(self, dataset: str, noise: str) -> Path:
        return self.root / "data" / "noisy" / dataset / noise

    def run(self, dataset: str, noise: str, method: str, seed: int) -> Path:
        return self.root / "runs" / dataset / noise / method / f"seed{seed}"

    def checkpoint(self, dataset: str, noise: str, method: str, seed: int) -> Path:
        # Outside DVC's outputs: DVC deletes a stage's outputs before running it, and a
        # killed run must find its checkpoint when `dvc repro` starts it again.
        return self.root / ".checkpoints" / dataset / noise / method / f"seed{seed}" / "last.pt"

    def metrics(self, dataset: str, noise: str, method: str, seed: int) -> Path:
        return self.root / "metrics" / dataset / noise / method / f"seed{seed}.json"

    def timing(self, dataset: str) -> Path:
        return self.root / "timing" / f"{dataset}.json"

    @property
    def reports(self) -> Path:
        return self.root / "reports"


# --------------------------------------------------------------------------- prepare


def prepare(params: dict, dataset: str, layout: Layout = Layout()) -> dict:
    from noisydml.data.registry import prepare_dataset

    t0 = time.perf_counter()
    info = prepare_dataset(dataset, params["datasets"][dataset], layout.prepared(dataset), base_dir=layout.root)
    print(
        f"prepared {dataset}: {info['num_samples']} images, {info['num_classes']} classes "
        f"({info['num_train_classes']} train / {info['num_test_classes']} test) in {time.perf_counter() - t0:.1f}s"
    )
    return info


# --------------------------------------------------------------------------- corrupt


def train_split(prepared_dir: Path):
    """The training part of a prepared dataset, labels mapped to 0..C-1 (in class order)."""
    from noisydml.data.prepared import PreparedDataset

    ds = PreparedDataset.load(prepared_dir)
    train = ds.split("train")
    classes = np.sort(train["label"].unique())
    dense = np.searchsorted(classes, train["label"].to_numpy())
    return ds, train, dense


def noise_inputs(params: dict, dataset: str, ds, train, layout: Layout):
    """What a noise kind may ask for: features of the training images, and verified-clean flags."""
    from noisydml.noise import NoiseInputs
    from noisydml.noise.features import pixel_features, run_features

    def features(cfg: dict):
        if cfg["source"] == "pixels":
            t0 = time.perf_counter()
            feats = pixel_features(ds.images[train["sample_id"].to_numpy()], cfg["pca_dim"], cfg["pixel_side"],
                                   seed=0)
            print(f"pixel features: PCA to {cfg['pca_dim']} dims in {time.perf_counter() - t0:.1f}s")
            return feats, {"source": "pixels", "pca_dim": cfg["pca_dim"], "pixel_side": cfg["pixel_side"]}
        run = run_name(dataset, cfg["noise"], cfg["method"], cfg["seed"])
        path = layout.run(dataset, cfg["noise"], cfg["method"], cfg["seed"]) / TRAIN_EMBEDDINGS
        feats, sha = run_features(path, train["sample_id"].to_numpy(), run)
        return feats, {"source": "run", "run": run, "path": str(path.relative_to(layout.root)), "sha256": sha}

    is_clean = None
    if "is_clean" in train.columns:
        is_clean = pd.to_numeric(train["is_clean"], errors="coerce").to_numpy(dtype=float)
    return NoiseInputs(features=features, is_clean=is_clean)


def corrupt(params: dict, dataset: str, noise: str, layout: Layout = Layout()) -> dict:
    from noisydml.noise import corrupt_labels

    ds, train, labels = train_split(layout.prepared(dataset))
    names = train.drop_duplicates("label").sort_values("label")["class_name"].tolist()
    table, per_class, stats = corrupt_labels(
        train["sample_id"].to_numpy(), labels, params["noise"][noise],
        noise_inputs(params, dataset, ds, train, layout), class_names=names,
    )
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


def check_features_fresh(stats: dict, layout: Layout) -> None:
    """Noisy labels made from a run's embeddings must come from that run's current embeddings.

    DVC cannot see this dependency (a matrix stage cannot depend on a run chosen
    per noise setting), so the train stage checks it instead of training on
    labels made from an older model.
    """
    from noisydml.data import DatasetError
    from noisydml.data.prepared import sha256_file

    feats = stats.get("features") or {}
    if feats.get("source") != "run":
        return
    path = layout.root / feats["path"]
    if not path.is_file() or sha256_file(path) != feats["sha256"]:
        raise DatasetError(
            f"noisy labels {stats['dataset']}/{stats['noise']} were made from the embeddings of run {feats['run']}, "
            f"which have changed (or gone) since; re-make them with `dvc repro -f corrupt@{stats['dataset']}-"
            f"{stats['noise']}` (after `dvc repro train@{feats['run']}`), then `dvc repro`"
        )


def load_noisy_labels(path: Path, train_sample_ids: np.ndarray) -> pd.DataFrame:
    from noisydml.data import DatasetError

    table = pd.read_csv(path / "labels.csv")
    if not np.array_equal(table["sample_id"].to_numpy(), train_sample_ids):
        raise DatasetError(
            f"{path / 'labels.csv'}: its sample ids do not match the prepared dataset's training split; "
            "re-run the corrupt stage (dvc repro)"
        )
    return table


# --------------------------------------------------------------------------- train


@dataclass
class RunData:
    """The training and test images of one (dataset, noise setting), as the trainer takes them."""

    train_rows: pd.DataFrame  # the whole training split (manifest rows)
    test_rows: pd.DataFrame
    noisy: pd.DataFrame       # labels.csv of the noise setting, row i = train_rows row i
    train_set: object         # engine.trainer.ImageSet: what is trained on
    test_set: object
    fingerprint: str          # images checksum + noisy labels digest
    #: Rows of train_rows trained on / held out for validation (``train.validation_classes``).
    fit_index: np.ndarray | None = None
    val_index: np.ndarray | None = None
    val_set: object | None = None


def validation_split(labels: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    """Rows whose (noisy) label is one of ``num_classes`` classes drawn by ``seed``: the same for every method."""
    classes = np.unique(labels)
    held = np.random.default_rng([seed, 7]).choice(classes, size=num_classes, replace=False)
    return np.isin(labels, held)


def load_run_data(dataset: str, noise: str, layout: Layout, validation_classes: int = 0, seed: int = 0) -> RunData:
    from noisydml.engine.trainer import ImageSet

    ds, train_rows, _ = train_split(layout.prepared(dataset))
    check_features_fresh(io.read_json(layout.noisy(dataset, noise) / "stats.json"), layout)
    noisy = load_noisy_labels(layout.noisy(dataset, noise), train_rows["sample_id"].to_numpy())
    test_rows = ds.split("test")
    images = np.asarray(ds.images)
    train_images = images[train_rows["sample_id"].to_numpy()]
    labels, is_noisy = noisy["label"].to_numpy(), noisy["is_noisy"].to_numpy().astype(bool)
    test_set = ImageSet(images[test_rows["sample_id"].to_numpy()], test_rows["label"].to_numpy())
    labels_digest = pd.util.hash_pandas_object(noisy, index=False).sum()
    fingerprint = f"{ds.info['images_sha256']}:{int(labels_digest)}"
    if not validation_classes:
        return RunData(train_rows, test_rows, noisy, ImageSet(train_images, labels, is_noisy), test_set, fingerprint)
    num_labels = len(np.unique(labels))
    if validation_classes >= num_labels:
        from noisydml.data import DatasetError

        raise DatasetError(f"train.validation_classes: {validation_classes} held out, but {dataset}/{noise}'s "
                           f"training labels have only {num_labels} classes")
    held = validation_split(labels, validation_classes, seed)
    fit_index, val_index = np.flatnonzero(~held), np.flatnonzero(held)
    fit_labels = np.unique(labels[fit_index], return_inverse=True)[1]  # renumbered 0..K-1
    return RunData(train_rows, test_rows, noisy,
                   ImageSet(train_images[fit_index], fit_labels, is_noisy[fit_index]), test_set,
                   f"{fingerprint}:val{validation_classes}", fit_index, val_index,
                   ImageSet(train_images[val_index], labels[val_index]))


def train(params: dict, dataset: str, noise: str, method: str, seed: int, layout: Layout = Layout()) -> Path:
    """Train one run; write ``model.pt``, ``test_embeddings.npz``, ``history.csv``, ``run.json``."""
    import torch

    from noisydml.engine.trainer import RunSpec, Trainer
    from noisydml.reporting.plots import plot_history
    from noisydml.tracking import MlflowTracker, git_commit

    data = load_run_data(dataset, noise, layout, params["train"]["validation_classes"], seed)
    spec = RunSpec(
        method=method,
        method_hparams=params["methods"][method],
        train=params["train"],
        seed=seed,
        data_fingerprint=data.fingerprint,
        evaluate=params["evaluate"],
    )
    name = run_name(dataset, noise, method, seed)
    tracker = MlflowTracker(
        params["tracking"]["experiment"],
        name,
        params={
            "dataset": dataset, "noise": noise, "method": method, "seed": seed,
            "dataset_settings": params["datasets"][dataset], "noise_settings": params["noise"][noise],
            "method_hparams": params["methods"][method], "train": params["train"],
        },
        tags={"dvc_stage": f"train@{name}", "git_commit": git_commit(layout.root), "dataset": dataset,
              "noise": noise, "method": method, "seed": str(seed)},
    )
    checkpoint = layout.checkpoint(dataset, noise, method, seed)
    trainer = Trainer(spec, data.train_set, data.test_set, checkpoint, tracker=tracker, val_set=data.val_set)
    try:
        result = trainer.fit()
    except BaseException:
        tracker.end(status="KILLED")
        raise

    out = layout.run(dataset, noise, method, seed)
    history = pd.DataFrame(result.history)
    with io.atomic_dir(out) as tmp:
        torch.save({"model": result.model.state_dict(), "method": result.method.state_dict(),
                    "train": params["train"], "method_name": method}, tmp / "model.pt")
        np.savez(tmp / "test_embeddings.npz", embeddings=result.test_embeddings.numpy(),
                 labels=data.test_set.labels, sample_ids=data.test_rows["sample_id"].to_numpy())
        train_embeddings = result.train_embeddings.numpy()
        if data.val_index is not None:  # every training sample, in the split's order, held-out ones included
            train_embeddings = np.empty((len(data.train_rows), train_embeddings.shape[1]), np.float32)
            train_embeddings[data.fit_index] = result.train_embeddings.numpy()
            train_embeddings[data.val_index] = result.val_embeddings.numpy()
        np.savez(tmp / TRAIN_EMBEDDINGS, embeddings=train_embeddings,
                 sample_ids=data.train_rows["sample_id"].to_numpy(), labels=data.noisy["label"].to_numpy(),
                 true_labels=data.noisy["true_label"].to_numpy())
        history.to_csv(tmp / "history.csv", index=False)
        plot_history(history, name, tmp / "training_curves.png")
        io.write_json(tmp / "run.json", {
            "run_name": name, "mlflow_run_id": result.run_id, "fingerprint": spec.fingerprint(),
            "resumed_from_epoch": result.resumed_from_epoch, "epochs": params["train"]["epochs"],
            "selected_epoch": result.selected_epoch, "model_selection": params["train"]["model_selection"],
            "validation_classes": params["train"]["validation_classes"],
        })
    tracker.log_artifact(out / "history.csv")
    tracker.log_artifact(out / "training_curves.png")
    tracker.end(status="FINISHED")
    checkpoint.unlink(missing_ok=True)  # the run is complete; runs/ holds the final model
    return out


# --------------------------------------------------------------------------- timing


def timing(params: dict, dataset: str, layout: Layout = Layout()) -> dict:
    """Seconds per training epoch of each ``timing.entries`` method on the same data (PRISM's Table 4).

    Every entry trains ``timing.epochs`` epochs from the same initial weights on
    ``timing.noise``'s labels, with the grid's train settings, no tracking and no
    checkpoint. The first epoch (allocations, empty memories) is left out of
    the mean when there are more.
    """
    import tempfile

    from noisydml.engine.trainer import NullTracker, RunSpec, Trainer, steps_per_epoch

    cfg = params["timing"]
    data = load_run_data(dataset, cfg["noise"], layout)
    train_cfg = {**params["train"], "epochs": cfg["epochs"], "eval_every": 0}
    batch = params["train"]["batch"]
    steps = steps_per_epoch(len(data.train_set.labels), batch["classes"] * batch["per_class"])
    rows = []
    for entry in cfg["entries"]:
        spec = RunSpec(method=entry["method"], method_hparams=entry["hparams"], train=train_cfg, seed=0,
                       data_fingerprint=data.fingerprint, evaluate=params["evaluate"])
        with tempfile.TemporaryDirectory() as tmp:
            result = Trainer(spec, data.train_set, data.test_set, Path(tmp) / "last.pt", tracker=NullTracker(),
                             progress=False).fit()
        seconds = [row["epoch_seconds"] for row in result.history]
        counted = seconds[1:] or seconds
        rows.append({
            "label": entry["label"], "method": entry["method"], "centres": entry["hparams"].get("centres"),
            "seconds_per_epoch": float(np.mean(counted)),
            "steps_per_epoch": steps,
            "seconds_per_step": float(np.mean(counted)) / steps,
            "epochs_counted": len(counted),
        })
        print(f"timing {dataset}/{cfg['noise']}: {entry['label']}: {rows[-1]['seconds_per_epoch']:.2f} s/epoch")
    for row in rows:
        row["relative_to_first"] = row["seconds_per_epoch"] / rows[0]["seconds_per_epoch"]
    result = {"dataset": dataset, "noise": cfg["noise"], "epochs": cfg["epochs"],
              "device": str(params["train"]["device"]), "rows": rows}
    io.write_json(layout.timing(dataset), result)
    return result


# --------------------------------------------------------------------------- evaluate


def evaluate(params: dict, dataset: str, noise: str, method: str, seed: int, layout: Layout = Layout(),
             log_to_mlflow: bool = True) -> dict:
    from noisydml.evaluation.retrieval import retrieval_metrics

    run = layout.run(dataset, noise, method, seed)
    if not (run / "test_embeddings.npz").is_file():
        raise FileNotFoundError(f"{run / 'test_embeddings.npz'}: missing; run the train stage first (dvc repro)")
    data = np.load(run / "test_embeddings.npz")
    cfg = params["evaluate"]
    t0 = time.perf_counter()
    metrics = retrieval_metrics(data["embeddings"], data["labels"], recall_at=cfg["recall_at"],
                                max_k=cfg["max_k"], nmi=cfg["nmi"], seed=seed)
    seconds = time.perf_counter() - t0
    run_info = io.read_json(run / "run.json")
    history = pd.read_csv(run / "history.csv")
    training = {"seconds_per_epoch": float(history["epoch_seconds"].mean())}
    # per-epoch diagnostics some methods log (PRISM: which samples its selection kept)
    from noisydml.reporting.tables import SELECTION_COLUMNS

    for column in SELECTION_COLUMNS:
        if column in history and history[column].notna().any():
            training[column] = [None if pd.isna(v) else float(v) for v in history[column]]
            training[f"final_{column}"] = training[column][-1]
    result = {
        "dataset": dataset, "noise": noise, "method": method, "seed": seed,
        "num_queries": int(len(data["labels"])), "num_classes": int(len(np.unique(data["labels"]))),
        "metrics": metrics, "training": training, "eval_seconds": seconds,
        "selected_epoch": run_info.get("selected_epoch"), "model_selection": run_info.get("model_selection"),
        "mlflow_run_id": run_info.get("mlflow_run_id"),
    }
    out = layout.metrics(dataset, noise, method, seed)
    io.write_json(out, result)
    if log_to_mlflow and run_info.get("mlflow_run_id"):
        from noisydml.tracking import log_to_run

        log_to_run(run_info["mlflow_run_id"], {f"final_{k}": v for k, v in metrics.items()}, [out])
    print(f"evaluate {run_name(dataset, noise, method, seed)}: " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return result


# --------------------------------------------------------------------------- report


def report(params: dict, layout: Layout = Layout()) -> Path:
    from noisydml.reporting.tables import write_report

    return write_report(params, layout)
