"""The label audit: detectors in one schema, judged against a hand-computed case, the probe out of sample."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from noisydml.audit import AUDIT_COLUMNS, detectors
from noisydml.audit.judge import judge, paired_bootstrap


def clusters(seed: int = 0, classes: int = 6, per_class: int = 40, noise: float = 0.3):
    """Well-separated Gaussian classes in 16-d; ``noise`` of the rows get another class's label."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (classes, 16)) * 4
    true = np.repeat(np.arange(classes), per_class)
    emb = centres[true] + rng.normal(0, 1, (len(true), 16))
    given = true.copy()
    flip = rng.random(len(true)) < noise
    given[flip] = (true[flip] + rng.integers(1, classes, flip.sum())) % classes
    return emb.astype(np.float32), given, true, np.arange(len(true)) + 100


def test_judge_against_a_hand_computed_case():
    scores = pd.DataFrame({"sample_id": range(6), "given_label": 0, "score": [0.9, 0.8, 0.7, 0.2, 0.1, 0.0],
                           "flagged": pd.array([True, True, False, True, False, False], dtype="boolean"),
                           "suggested_label": -1})
    noisy = np.array([True, False, True, False, False, False])
    out = judge(scores, noisy)
    # ranks: noisy at 1st and 3rd of 6. AUROC = pairs (noisy above clean) / 8: 4 + 3 = 7/8
    assert out["auroc"] == pytest.approx(7 / 8)
    assert out["auprc"] == pytest.approx((1 / 1 + 2 / 3) / 2)  # precision at each noisy row's rank
    assert out["precision_at_k"] == pytest.approx(1 / 2)  # top 2: rows 0, 1
    assert out["flag_precision"] == pytest.approx(1 / 3) and out["flag_recall"] == pytest.approx(1 / 2)
    assert out["flag_f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    # AQuA's weighted F1: the wrong class's F1 (0.4, 2 rows) and the right class's (precision 2/3, recall 2/4: 4/7,
    # 4 rows), weighted by their rows
    assert out["weighted_f1"] == pytest.approx((2 * 0.4 + 4 * 4 / 7) / 6)
    assert out["noise_rate"] == pytest.approx(2 / 6)


@pytest.mark.parametrize("name", ["knn_disagreement", "datalab", "confident_learning", "knn_confident_learning",
                                  "centroid_confident_learning"])
def test_each_detector_gives_the_schema_and_finds_flips(name):
    emb, given, true, ids = clusters()
    if name == "confident_learning":
        frame = detectors.confident_learning(detectors.cross_fitted_probabilities(emb, given, 5, 0), given, ids)
    else:
        frame = getattr(detectors, name)(emb, given, ids)
    assert tuple(frame.columns) == AUDIT_COLUMNS and len(frame) == len(given)
    assert (frame["sample_id"] == ids).all() and (frame["given_label"] == given).all()
    out = judge(frame, given != true)
    assert out["auroc"] > 0.9 and out["flag_f1"] > 0.7
    suggested = frame["suggested_label"].to_numpy()
    right = suggested[suggested >= 0] == true[suggested >= 0]
    assert right.mean() > 0.9  # a suggestion is mostly the true class


def test_the_open_set_detector_ranks_images_of_no_training_class_first_and_suggests_nothing():
    """Images of a class outside the training classes, filed under training labels (small-cluster noise's kind):
    far from every class mean, they score above every row of a training class, closed-set flips included."""
    emb, given, true, ids = clusters(classes=6, per_class=40, noise=0.2)
    rng = np.random.default_rng(1)
    outsider = (rng.normal(0, 1, (10, 16)) + rng.normal(0, 1, 16) * 4).astype(np.float32)
    frame = detectors.open_set(np.vstack([emb, outsider]), np.concatenate([given, np.arange(10) % 6]),
                               np.arange(len(ids) + 10), folds=5, seed=0)
    assert set(frame.nlargest(10, "score")["sample_id"]) == set(range(len(ids), len(ids) + 10))
    assert frame["flagged"].isna().all() and (frame["suggested_label"] == -1).all()


def test_the_probe_never_scores_a_row_it_was_fitted_on(monkeypatch):
    from sklearn.linear_model import LogisticRegression

    emb, given, true, ids = clusters(classes=4, per_class=20)
    key = {row.tobytes(): i for i, row in enumerate(detectors._unit(emb).astype(np.float32))}
    fitted, scored = [], []
    fit, predict = LogisticRegression.fit, LogisticRegression.predict_proba

    def recording_fit(self, x, y):
        fitted.append({key[r.tobytes()] for r in x})
        return fit(self, x, y)

    def recording_predict(self, x):
        scored.append({key[r.tobytes()] for r in x})
        return predict(self, x)

    monkeypatch.setattr(LogisticRegression, "fit", recording_fit)
    monkeypatch.setattr(LogisticRegression, "predict_proba", recording_predict)
    detectors.cross_fitted_probabilities(emb, given, folds=4, seed=0)
    assert len(fitted) == len(scored) == 4
    assert all(not f & s for f, s in zip(fitted, scored))
    assert set().union(*scored) == set(range(len(given)))


def test_the_centroid_probe_never_scores_a_row_with_a_mean_that_holds_it(monkeypatch):
    """Every row's probabilities come from class means of rows of other folds only: moving a row's own embedding
    changes no probability of its own fold's rows (it is in none of their probes); the folds deal each class's
    rows round-robin; the batches give the one-batch result."""
    emb, given, true, ids = clusters(classes=5, per_class=12)
    folds = detectors.class_folds(given, 4, seed=0)
    for c in range(5):  # each class dealt evenly over the folds
        assert np.ptp(np.bincount(folds[given == c], minlength=4)) <= 1
    whole = detectors.centroid_confident_learning(emb, given, ids, folds=4)
    batched = detectors.centroid_confident_learning(emb, given, ids, folds=4, batch_bytes=5 * 4 * 7)
    pd.testing.assert_frame_equal(whole, batched)
    seen = []

    import cleanlab.experimental.label_issues_batched as batched_module

    update = batched_module.LabelInspector.score_label_quality

    def recording(self, labels, probs):
        seen.append(np.asarray(probs).copy())
        return update(self, labels, probs)

    monkeypatch.setattr(batched_module.LabelInspector, "score_label_quality", recording)
    detectors.centroid_confident_learning(emb, given, ids, folds=4)
    before = np.concatenate(seen)
    row = int(np.flatnonzero(folds == 0)[0])
    moved = emb.copy()
    moved[row] = -moved[row] * 3
    seen.clear()
    detectors.centroid_confident_learning(moved, given, ids, folds=4)
    after = np.concatenate(seen)
    order = np.concatenate([np.flatnonzero(folds == f) for f in range(4)])
    same_fold = folds[order] == 0
    others = same_fold & (order != row)
    np.testing.assert_array_equal(before[others], after[others])  # its fold-mates' probe never held it
    assert not np.array_equal(before[~same_fold], after[~same_fold])  # the other folds' probes did


def test_the_dense_detectors_refuse_a_benchmark_scale_naming_the_batched_ones(monkeypatch):
    monkeypatch.setattr(detectors, "DENSE_PROBE_BYTES", 1000)
    emb, given, true, ids = clusters()
    with pytest.raises(ValueError, match=r"240 rows x 6 classes.*centroid_confident_learning or "
                                         r"knn_confident_learning"):
        detectors.cross_fitted_probabilities(emb, given)
    with pytest.raises(ValueError, match=r"datalab: .*240 rows x 6 classes.*centroid_confident_learning"):
        detectors.datalab(emb, given, ids)


def test_no_detector_forks_a_process(monkeypatch):
    """cleanlab's find_label_issues forks a process pool by default; forked from a launcher's Ray worker (threads
    running) a child hung on an inherited lock. Every detector runs in this process."""
    import os

    def refuse():
        raise AssertionError("a detector forked a process")

    monkeypatch.setattr(os, "fork", refuse)
    emb, given, true, ids = clusters()
    probs = detectors.cross_fitted_probabilities(emb, given)
    detectors.confident_learning(probs, given, ids)
    detectors.estimated_noise_rate(probs, given)
    for name in ("datalab", "knn_confident_learning", "centroid_confident_learning", "knn_disagreement"):
        getattr(detectors, name)(emb, given, ids)


def test_method_decisions_in_the_schema():
    saved = {"sample_id": np.array([7, 5, 6]), "keep": np.array([1.0, 0.0, 0.25]),
             "pseudo_labels": np.array([2, 3, -1])}
    frame = detectors.method_decisions(saved, np.array([5, 6, 7]), np.array([1, 1, 2]))
    assert frame["score"].tolist() == [1.0, 0.75, 0.0]
    assert frame["flagged"].tolist() == [True, True, False]
    assert frame["suggested_label"].tolist() == [3, -1, -1]  # row 7's pseudo-label is its given label
    weights = detectors.method_decisions({"sample_id": np.array([5, 6]), "weights": np.array([2.0, 1.0])},
                                         np.array([5, 6]), np.array([0, 0]))
    assert weights["score"].tolist() == [0.0, 0.5] and weights["flagged"].isna().all()
    assert detectors.method_decisions({"sample_id": np.array([5])}, np.array([5]), np.array([0])) is None
    # a row the method never saw (a chained run on a subset): no decision, score 0
    partial = detectors.method_decisions({"sample_id": np.array([5]), "keep": np.array([0.0])},
                                         np.array([5, 9]), np.array([0, 0]))
    assert partial["score"].tolist() == [1.0, 0.0] and partial["flagged"].tolist() == [True, False]


def test_paired_bootstrap_interval_holds_the_difference():
    emb, given, true, ids = clusters(seed=1)
    noisy = given != true
    good = detectors.knn_disagreement(emb, given, ids)["score"].to_numpy()
    rng = np.random.default_rng(0)
    out = paired_bootstrap(good, rng.random(len(good)), noisy, samples=200)
    assert out["low"] <= out["difference"] <= out["high"] and out["low"] > 0.2


def test_estimated_noise_rate_is_near_the_true_one():
    emb, given, true, ids = clusters(seed=2, noise=0.25)
    probs = detectors.cross_fitted_probabilities(emb, given, 5, 0)
    assert detectors.estimated_noise_rate(probs, given) == pytest.approx((given != true).mean(), abs=0.08)


def test_the_contact_sheet_shows_the_top_suspects_with_every_image_present_and_labels_escaped(tmp_path):
    import re

    from noisydml.audit.sheet import rank_suspects, write_sheet

    emb, given, true, ids = clusters(classes=4, per_class=15)
    audits = {"knn_disagreement": detectors.knn_disagreement(emb, given, ids),
              "confident_learning": detectors.confident_learning(
                  detectors.cross_fitted_probabilities(emb, given, 3, 0), given, ids)}
    suspects = rank_suspects(audits)
    assert suspects["consensus"].is_monotonic_decreasing and len(suspects) == len(ids)
    assert set(suspects.columns) >= {"sample_id", "given_label", "consensus", "agree", "suggested_label",
                                     "score_knn_disagreement", "score_confident_learning"}
    images = np.random.default_rng(0).integers(0, 256, (len(ids), 8, 8, 3), dtype=np.uint8)
    names = ["<b>cat</b>", "dog & co", "A \"quoted\"", "plain"]
    page = write_sheet(suspects, images, ids, given, names, tmp_path / "sheet", top_n=12)
    text = page.read_text()
    rows = re.findall(r"<tr><td>\d+</td>", text)
    assert len(rows) == 12
    sources = re.findall(r'<img src="([^"]+)"', text)
    assert sources and all((page.parent / s).is_file() for s in sources)
    assert "<b>cat</b>" not in text and ("&lt;b&gt;cat&lt;/b&gt;" in text or "dog &amp; co" in text)
    assert (page.parent / "suspects.csv").is_file()
    # the top suspect is on the page first, its image the first thumbnail of its row
    assert sources[0] == f"thumbs/{suspects['sample_id'].iloc[0]}.png"


def _noise_tables(root, dataset="mine", noise="clean", labels=None, per_class=None):
    folder = root / "data" / "noisy" / dataset / noise
    folder.mkdir(parents=True, exist_ok=True)
    labels.to_csv(folder / "labels.csv", index=False)
    per_class.to_csv(folder / "per_class.csv", index=False)
    return root / "runs" / dataset / noise / "prism" / "seed0"


def test_training_class_names_follow_the_ids_the_run_trained_on(tmp_path):
    """Small-cluster noise removes classes and renumbers the rest: label 1 of the run is class 2 of the dataset."""
    from noisydml.audit.run import training_class_names

    per_class = pd.DataFrame({"true_label": [0, 1, 2], "class_name": ["zero", "one", "two"], "label": [0, -1, 1]})
    labels = pd.DataFrame({"sample_id": range(4), "label": [0, 0, 1, 1], "true_label": [0, 1, 2, 2],
                           "is_noisy": [0, 1, 0, 0]})
    run = _noise_tables(tmp_path, labels=labels, per_class=per_class)
    assert training_class_names(run).tolist() == ["zero", "two"]


def test_the_audit_reads_no_file_of_the_test_split(tmp_path):
    """A tripwire: while the audit runs, opening any file of the fake repository but the run's training
    embeddings, its decisions and the corrupt stage's label tables fails the test (the run's test embeddings and
    the prepared dataset, which holds the test images, sit beside them)."""
    import os
    import sys

    from noisydml.audit.run import audit_run, judged_table, training_class_names, truth_of

    emb, given, true, ids = clusters(classes=4, per_class=15)
    run = _noise_tables(tmp_path, labels=pd.DataFrame({"sample_id": ids, "label": given, "true_label": true,
                                                       "is_noisy": (given != true).astype(int)}),
                        per_class=pd.DataFrame({"true_label": range(4), "class_name": list("abcd"),
                                                "label": range(4)}))
    run.mkdir(parents=True)
    np.savez(run / "train_embeddings.npz", sample_ids=ids, labels=given, embeddings=emb)
    np.savez(run / "decisions.npz", sample_id=ids, keep=np.ones(len(ids)), visits=np.ones(len(ids)))
    np.savez(run / "test_embeddings.npz", sample_ids=ids, labels=given, embeddings=emb)
    prepared = tmp_path / "data" / "prepared" / "mine"
    prepared.mkdir(parents=True)
    np.save(prepared / "images.npy", np.zeros((len(ids), 2, 2, 1), np.uint8))
    allowed = {run / "train_embeddings.npz", run / "decisions.npz", run.parents[4] / "data/noisy/mine/clean/labels.csv",
               run.parents[4] / "data/noisy/mine/clean/per_class.csv"}
    opened = []

    def hook(event, args):
        if armed and event == "open" and isinstance(args[0], (str, bytes, Path)):
            path = Path(os.fsdecode(args[0])).resolve()
            if path.is_relative_to(tmp_path.resolve()) and path not in {p.resolve() for p in allowed}:
                opened.append(path)
                raise AssertionError(f"the audit opened {path}")

    armed = False
    sys.addaudithook(hook)  # process-wide and permanent: disarmed below
    armed = True
    try:
        audits = audit_run(run, k=5, folds=3)
        judged_table(audits, truth_of(run))
        training_class_names(run)
    finally:
        armed = False
    assert not opened and set(audits) == {"method", "datalab", "confident_learning", "centroid_confident_learning",
                                          "knn_disagreement"}


def test_a_cleaned_listing_is_read_back_by_a_folder_dataset(tmp_path):
    """drop removes the suspected training rows, relabel gives them the suggestion (drops them without one); the
    test rows, every split and the unsuspected rows stay; the folder kind's csv form reads the file back."""
    import yaml
    from PIL import Image

    from noisydml.audit.clean import cleaned_listing, plan
    from noisydml.data.folder import load_folder_dataset
    from noisydml.data.prepared import PreparedDataset
    from noisydml.data.registry import prepare_dataset
    from noisydml.tools.check import validate_all

    for c in range(6):
        for i in range(4):
            path = tmp_path / "imgs" / f"class{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((6, 6, 3), 10 * c + i, np.uint8)).save(path)
    raw = yaml.safe_load(open("params.yaml"))
    raw["datasets"]["mine"] = {"kind": "folder", "root": "imgs", "image_size": 8, "channels": 3}
    raw["grid"]["datasets"], raw["chains"], raw["figures"]["bspml_maps"] = ["mine"], {}, {}
    raw["timing"]["dataset"] = "mine"
    raw["train"]["batch"] = {"classes": 3, "per_class": 2}
    cfg = validate_all(raw)["datasets"]["mine"]
    prepare_dataset("mine", cfg, tmp_path / "prepared", base_dir=tmp_path)
    manifest = PreparedDataset.load(tmp_path / "prepared").manifest
    train = manifest[manifest["split"] == "train"]
    assert len(train) == 12  # class0..2 train, class3..5 test
    names = pd.Series(["class0", "class1", "class2"])
    # rows 1 and 5 suspected by both detectors (5 with a suggestion: class2), row 9 by one
    suspects = pd.DataFrame({"sample_id": train["sample_id"], "given_label": train["label"], "detectors": 2,
                             "agree": [2 if s in (1, 5) else (1 if s == 9 else 0) for s in train["sample_id"]],
                             "suggested_label": [2 if s == 5 else -1 for s in train["sample_id"]],
                             "suggested_by": [2 if s == 5 else 0 for s in train["sample_id"]]})
    out = tmp_path / "lists" / "cleaned.csv"

    def acted(action, min_agree=2):
        return plan(suspects, {}, float("nan"), action, "agree", min_agree, max_share=1.0)[0]

    dropped = cleaned_listing(cfg, tmp_path, manifest, names, suspects, acted("drop"), out)
    assert dropped["dropped"] == 2 and dropped["written"] == 22
    images, labels, classes, _, split = load_folder_dataset({"root": "", "csv": "lists/cleaned.csv",
                                                             "image_size": 8, "channels": 3}, tmp_path)
    assert len(images) == 22 and (split == "test").sum() == 12 and classes == [f"class{c}" for c in range(6)]
    assert sorted(images[:, 0, 0, 0][labels == 0].tolist()) == [0, 2, 3]  # class0's image 1 dropped
    relabelled = cleaned_listing(cfg, tmp_path, manifest, names, suspects, acted("relabel"), out)
    assert relabelled["dropped"] == 1 and relabelled["relabelled"] == 1
    images, labels, classes, _, split = load_folder_dataset({"root": "", "csv": "lists/cleaned.csv",
                                                             "image_size": 8, "channels": 3}, tmp_path)
    assert sorted(images[:, 0, 0, 0][labels == 2].tolist()) == [11, 20, 21, 22, 23]  # class1's image 1 -> class2
    with pytest.raises(ValueError, match="min_agree 3: allowed 1..2"):
        acted("drop", 3)


def test_the_script_cleans_by_the_consensus_of_several_seeds_and_refuses_past_the_bound(tmp_path, capsys):
    """scripts/label_audit.py on two seeds' runs of a folder dataset: one listing from their consensus, as many rows
    acted on as the estimate, the retrain's settings printed; past --max-share it refuses and writes nothing."""
    import yaml
    from PIL import Image

    from conftest import load_script
    from noisydml.data.registry import prepare_dataset
    from noisydml.tools.check import validate_all

    classes, per_class = 12, 10
    for c in range(classes):
        for i in range(per_class):
            path = tmp_path / "imgs" / f"class{c:02d}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((6, 6, 3), 20 * c + i, np.uint8)).save(path)
    raw = yaml.safe_load(open("params.yaml"))
    raw["datasets"]["mine"] = {"kind": "folder", "root": "imgs", "image_size": 8, "channels": 3}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    cfg = validate_all(raw)["datasets"]["mine"]
    prepare_dataset("mine", cfg, tmp_path / "data" / "prepared" / "mine", base_dir=tmp_path)
    train_ids = np.arange(classes // 2 * per_class)  # the first half of the classes train
    true = train_ids // per_class
    given = true.copy()
    given[::5] = (true[::5] + 1) % (classes // 2)  # every fifth row wrong: 20 %
    _noise_tables(tmp_path, labels=pd.DataFrame({"sample_id": train_ids, "label": given, "true_label": true,
                                                 "is_noisy": (given != true).astype(int)}),
                  per_class=pd.DataFrame({"true_label": range(classes // 2), "label": range(classes // 2),
                                          "class_name": [f"class{c:02d}" for c in range(classes // 2)]}))
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (classes // 2, 16)) * 4
    runs = []
    for seed in (0, 1):
        run = tmp_path / "runs" / "mine" / "clean" / "ms" / f"seed{seed}"
        run.mkdir(parents=True)
        emb = centres[true] + rng.normal(0, 1, (len(true), 16))
        np.savez(run / "train_embeddings.npz", sample_ids=train_ids, labels=given, embeddings=emb.astype(np.float32))
        runs.append(str(run))
    script = load_script("label_audit")
    out = tmp_path / "mine-cleaned.csv"
    script.main([*runs, "--clean-csv", str(out)])
    printed = capsys.readouterr().out
    listing = pd.read_csv(out)
    dropped = set(f"imgs/class{c:02d}/{i}.png" for c in range(classes // 2) for i in range(per_class)) - set(
        listing.loc[listing["split"] == "train", "path"])
    wrong = {f"imgs/class{true[r]:02d}/{r % per_class}.png" for r in train_ids[::5]}
    assert "retrain: at least" in printed and "train.epochs" in printed
    assert abs(len(dropped) - len(wrong)) <= 2 and len(dropped & wrong) >= 0.9 * len(wrong)
    assert "held another listing" not in printed
    # another listing written over this one: DVC would not see it (a folder dataset's params name the file), so
    # the script says to retrain from a new name
    script.main([*runs, "--clean-csv", str(out), "--action", "relabel"])
    assert f"WARNING: {out} held another listing, now replaced" in capsys.readouterr().out
    out.unlink()
    with pytest.raises(SystemExit, match="not written: it would act on .* above max_share 10%"):
        script.main([*runs, "--clean-csv", str(out), "--max-share", "0.1"])
    assert not out.exists()


def test_the_precision_recall_curve_is_interpolated_by_hand():
    """Scores rank the rows noisy, clean, noisy, clean: recall 1/2 at precision 1, recall 1 at precision 2/3;
    interpolated precision = the best at any recall at least r."""
    from noisydml.pipeline.audit import RECALL_GRID, pr_curve

    curve = pr_curve(np.array([0.9, 0.8, 0.7, 0.1]), np.array([True, False, True, False]))
    assert curve[RECALL_GRID <= 0.5] == pytest.approx(1.0)
    assert curve[RECALL_GRID > 0.5] == pytest.approx(2 / 3)


def test_the_sheet_refuses_a_row_that_is_not_a_training_row():
    from noisydml.pipeline.audit import training_images

    class Prepared:
        manifest = pd.DataFrame({"split": ["train", "train", "test"]})
        images = np.zeros((3, 2, 2, 1), np.uint8)
        stored_as_files = decoded_per_batch = False

    assert len(training_images(Prepared(), np.array([0, 1]))) == 2
    with pytest.raises(ValueError, match="sample 2 is not a training row"):
        training_images(Prepared(), np.array([1, 2]))


def _browser() -> str:
    """Chromium's path; skips the test without one, or fails it where .ci/run requires one
    (NOISYDML_REQUIRE_BROWSER=1)."""
    import os
    import shutil

    browser = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)
    if browser is None:
        if os.environ.get("NOISYDML_REQUIRE_BROWSER") == "1":
            pytest.fail("no chromium on PATH, and NOISYDML_REQUIRE_BROWSER=1 (apt-get install chromium)")
        pytest.skip("no chromium on PATH (.ci/run installs it)")
    return browser


def test_the_contact_sheet_renders_in_a_headless_browser(tmp_path):
    """Debian's Chromium opens the sheet from the file system and takes a screenshot: the thumbnails load (the
    screenshot holds their pixels, not only text on white). .ci/run installs Chromium and sets
    NOISYDML_REQUIRE_BROWSER=1, so there it fails instead of skipping."""
    import subprocess

    from PIL import Image

    from noisydml.audit.sheet import rank_suspects, write_sheet

    browser = _browser()
    emb, given, true, ids = clusters(classes=4, per_class=15)
    audits = {"knn_disagreement": detectors.knn_disagreement(emb, given, ids)}
    # saturated red thumbnails: a colour no text or border of the page has
    images = np.zeros((len(ids), 8, 8, 3), np.uint8)
    images[..., 0] = 255
    page = write_sheet(rank_suspects(audits), images, ids, given, ["a", "b", "c", "d"], tmp_path / "sheet", top_n=5)
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=900,700", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (700, 900)
    red = (pixels[..., 0] > 200) & (pixels[..., 1] < 60) & (pixels[..., 2] < 60)
    # 5 rows x (1 + up to 3 + 3) thumbnails of 64 x 64 px each, at least the first rows' in the window
    assert red.sum() > 10 * 64 * 64


def test_the_sheet_names_each_suspect_by_its_file_and_class_in_a_browser_and_lists_conflicting_duplicates(tmp_path):
    """A dataset stored as files: Chromium's rendered page (--dump-dom) shows each suspect's file path and its
    given and suggested class names, and the near-duplicates with conflicting labels; suspects.csv and
    conflicts.csv carry the same paths and names."""
    import html
    import subprocess

    from PIL import Image

    from noisydml.audit.sheet import rank_suspects, write_sheet

    browser = _browser()
    emb, given, true, ids = clusters(classes=4, per_class=15)
    names = ["red kite", "barn owl", "wren", "jay"]
    paths = []
    for sample, label in zip(ids, true):
        path = tmp_path / "photos" / names[label].replace(" ", "_") / f"img_{sample:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 40 * int(label), np.uint8)).save(path)
        paths.append(path)
    path_of = dict(zip(ids.tolist(), paths))
    audits = {"knn_disagreement": detectors.knn_disagreement(emb, given, ids)}
    suspects = rank_suspects(audits)
    conflicts = [(int(ids[0]), int(ids[20]), int(given[0]), int(given[20]))]
    page = write_sheet(suspects, paths, ids, given, names, tmp_path / "sheet", top_n=5, conflicts=conflicts)
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    top = suspects.head(5)
    for sample, label in zip(top["sample_id"], top["given_label"]):
        assert html.escape(str(path_of[sample])) in dom and names[label] in dom
    assert "Near-duplicates with conflicting labels (1)" in dom and html.escape(str(paths[20])) in dom
    table = pd.read_csv(page.parent / "suspects.csv")
    assert table["path"].tolist() == [str(path_of[s]) for s in suspects["sample_id"]]
    assert table["given_class"].tolist() == [names[k] for k in suspects["given_label"]]
    pairs = pd.read_csv(page.parent / "conflicts.csv")
    assert pairs[["path", "other_path"]].values.tolist() == [[str(paths[0]), str(paths[20])]]


def test_ties_are_broken_by_row_index_whatever_the_search_order(monkeypatch):
    """Rows tied at the k-th similarity are chosen by index, not by the search's order; the batched confident
    learning flags, among rows of equal quality, the lowest indices first."""
    import noisydml.neighbours as neighbours

    emb = np.array([[1, 0], [1, 0], [1, 0], [1, 0], [0, 1]], np.float32)
    real = neighbours.knn

    def reversed_ties(x, k, gallery=None, use_gpu=False):  # a search that returns tied rows in reverse order
        sims, idx = real(x, k, gallery, use_gpu)
        order = np.lexsort((-idx, -sims), axis=-1)
        return np.take_along_axis(sims, order, 1), np.take_along_axis(idx, order, 1)

    monkeypatch.setattr(neighbours, "knn", reversed_ties)
    assert detectors.nearest(emb, 2).tolist()[:4] == [[1, 2], [0, 2], [0, 1], [0, 1]]
    assert detectors.lowest(np.array([0.5, 0.1, 0.1, 0.1, 0.9]), 2).tolist() == [1, 2]


def test_a_cleaning_follows_the_estimate_and_refuses_beyond_its_bound_or_when_detectors_disagree():
    """rule estimate acts on round(rate x N) rows, most suspected first; above max_share, or with two detectors'
    top sets overlapping less than min_overlap, it refuses naming the figure, unless forced; relabel uses a
    suggestion only where two detectors make it."""
    from noisydml.audit.clean import CleaningRefused, plan
    from noisydml.audit.sheet import rank_suspects

    ids = np.arange(10)
    given = np.zeros(10, np.int64)
    score = np.linspace(1, 0, 10)

    def frame(s, suggested):
        return detectors._frame(ids, given, s, s > 0.5, suggested)

    same = {"datalab": frame(score, np.where(ids < 2, 1, -1)),
            "knn_disagreement": frame(score, np.where(ids < 1, 1, -1))}
    acted, facts = plan(rank_suspects(same), same, 0.2, "relabel")
    assert acted["sample_id"].tolist() == [0, 1] and acted["new_label"].tolist() == [1, -1]
    assert facts["acted_share"] == 0.2 and facts["overlaps"] == {"datalab~knn_disagreement": 1.0}
    with pytest.raises(CleaningRefused, match="act on 40.0% of the training rows, above max_share 30%"):
        plan(rank_suspects(same), same, 0.4)
    assert len(plan(rank_suspects(same), same, 0.4, force=True)[0]) == 4
    apart = {"datalab": frame(score, np.full(10, -1)), "knn_disagreement": frame(score[::-1].copy(), np.full(10, -1))}
    with pytest.raises(CleaningRefused, match="overlap datalab~knn_disagreement 0.00, below min_overlap 0.50"):
        plan(rank_suspects(apart), apart, 0.2)


def test_knn_confident_learning_in_batches_is_the_one_batch_result_and_never_dense(monkeypatch):
    """Batches of a few rows give the scores and flags of one batch; no call ever builds more rows of dense
    probabilities than one batch holds; its noise-rate estimate is near the truth."""
    emb, given, true, ids = clusters(seed=3, noise=0.25)
    whole = detectors.knn_confident_learning(emb, given, ids, k=10)
    built = []
    dense = detectors.knn_probabilities
    monkeypatch.setattr(detectors, "knn_probabilities", lambda labels, c: built.append(len(labels)) or dense(labels, c))
    classes = int(given.max()) + 1
    batched = detectors.knn_confident_learning(emb, given, ids, k=10, batch_bytes=4 * classes * 7)
    assert max(built) == 7 and sum(built) == 2 * len(given)  # two passes over batches of 7 rows
    assert np.allclose(batched["score"], whole["score"]) and (batched["flagged"] == whole["flagged"]).all()
    assert whole.attrs["estimated_noise_rate"] == pytest.approx((given != true).mean(), abs=0.08)


def test_only_verified_rows_are_judged_on_a_dataset_with_verification_flags(tmp_path):
    """Food-101N's form: the manifest's is_clean is 1 / 0 for verified rows, empty for the rest; the corrupt stage
    counts an unverified row as clean. The truth is NA there, and the judge leaves those rows out."""
    from noisydml.audit.run import judged_table, known_noise, truth_of

    run = _noise_tables(tmp_path, labels=pd.DataFrame({"sample_id": range(6), "label": 0, "true_label": 0,
                                                       "is_noisy": [1, 0, 0, 1, 0, 0]}),
                        per_class=pd.DataFrame({"true_label": [0], "class_name": ["a"], "label": [0]}))
    prepared = tmp_path / "data" / "prepared" / "mine"
    prepared.mkdir(parents=True)
    pd.DataFrame({"sample_id": range(6), "label": 0, "class_name": "a", "split": "train",
                  "is_clean": ["0", "1", "", "", "1", ""]}).to_csv(prepared / "manifest.csv", index=False)
    truth = truth_of(run)
    assert truth.isna().tolist() == [False, False, True, True, False, True] and known_noise(truth)
    scores = pd.DataFrame({"sample_id": range(6), "given_label": 0, "score": [0.9, 0.1, 0.8, 0.1, 0.2, 0.95],
                           "flagged": pd.array([True, False, True, False, False, True], dtype="boolean"),
                           "suggested_label": -1})
    row = judged_table({"d": scores}, truth).iloc[0]
    # judged on rows 0, 1, 4 only: the noisy row 0 ranks first, so AUROC 1 and flag precision 1
    assert row["rows"] == 3 and row["auroc"] == 1.0 and row["flag_precision"] == 1.0


def _miniature_params(raw, kind: str, archives: dict, expect: dict, noise: str, noise_cfg: dict) -> dict:
    """``raw`` reduced to one miniature dataset ``d`` (its real archives, served) at ``noise``, one tiny PRISM run
    on its files, and the label audit turned on for it."""
    from conftest import benchmark_params

    raw["noise"][noise] = noise_cfg
    raw["grid"].update(noises=[noise], methods=["prism"], seeds=[0])
    raw["timing"]["noise"] = noise
    raw["train"].update(epochs=1, backbone_width=4, embedding_dim=8, pretrained="none", validation_classes=0,
                        model_selection="last", input={**raw["train"]["input"], "crop": 32, "resize": 36})
    raw["runtime"]["threads"] = 1
    raw["figures"]["label_audit"].update(datasets=["d"], methods=["prism"],
                                         detectors=["datalab", "confident_learning", "knn_disagreement"], k=5,
                                         folds=3, top=8, bootstrap_samples=100)
    return benchmark_params(raw, "d", {"kind": kind, "local_dir": "", "archives": archives, "expect": expect})


def _audited(params: dict, noise: str, root: Path) -> Path:
    """The stages a user's ``dvc repro`` runs for the audit, as library calls: download, prepare (the dataset's
    real layout), corrupt, train, audit; returns the audit's folder."""
    from noisydml.pipeline.audit import audit
    from noisydml.pipeline.corrupt import corrupt
    from noisydml.pipeline.download import download
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.prepare import prepare
    from noisydml.pipeline.train import train
    from noisydml.runs import GRID, Run

    layout = Layout(root)
    if not layout.prepared("d").is_dir():
        download(params, "d", layout)
        prepare(params, "d", layout)
    corrupt(params, "d", noise, layout)
    train(params, Run(GRID, f"d-{noise}-prism-0", "d", noise, "prism", 0, "prism"), layout)
    return audit(params, "d", noise, layout)


def _sheet_images_resolve(folder: Path) -> None:
    from html.parser import HTMLParser

    class Images(HTMLParser):
        sources: list = []

        def handle_starttag(self, tag, attrs):
            if tag == "img":
                self.sources.append(dict(attrs)["src"])

    page = Images()
    page.sources = []
    page.feed((folder / "sheet" / "index.html").read_text())
    assert page.sources and all((folder / "sheet" / src).is_file() for src in page.sources)


def test_food101n_in_its_real_layout_is_judged_on_its_verified_rows_only(tmp_path, raw_params, local_server):
    """The Food-101N miniature (the release's zip and Food-101's tarball, verification tsv files): the audit of a
    run on its own labels judges the verified rows (3 of each class's 4; the first verified noisy), never the
    unverified ones, and shows the images from the release's files."""
    from conftest import serve_archives
    from noisydml.tools.rehearsal import TRAIN_CLASSES, TRAIN_PER_CLASS, miniature

    base, served = local_server
    mini = miniature("food101n", base)
    params = _miniature_params(raw_params, "food101n", serve_archives(local_server, mini.archives), mini.expect,
                               "clean", {"kind": "none"})
    folder = _audited(params, "clean", tmp_path)
    judged = pd.read_csv(folder / "judged.csv")
    verified = TRAIN_CLASSES * (TRAIN_PER_CLASS - 1)
    assert set(judged["detector"]) == {"method", "datalab", "confident_learning", "knn_disagreement"}
    assert (judged["rows"] == verified).all()
    assert judged["noise_rate"].to_numpy() == pytest.approx(TRAIN_CLASSES / verified)
    scores = pd.read_csv(folder / "scores" / "prism-seed0.csv")
    assert len(scores) == 4 * TRAIN_CLASSES * TRAIN_PER_CLASS  # every row scored, judged or not
    assert len(pd.read_csv(folder / "sheet" / "suspects.csv")) == TRAIN_CLASSES * TRAIN_PER_CLASS  # all, ranked
    assert (folder / "sheet" / "index.html").read_text().count("<tr><td>") == 8  # the top
    _sheet_images_resolve(folder)


def test_cnwl_red_cars_is_judged_on_every_training_row_by_its_annotations(tmp_path, raw_params, local_server):
    """The CNWL Red Stanford Cars miniature (the release's zip, web images fetched by URL, car_ims.tgz): a run on
    its own labels is judged on every training row, the truth being the annotators' verdict on each web image
    (one of each class's four rows is a web image judged wrong), and the sheet shows the fetched images."""
    from conftest import serve_archives
    from noisydml.tools.rehearsal import TRAIN_CLASSES, TRAIN_PER_CLASS, miniature

    base, served = local_server
    mini = miniature("cnwl_cars", base)
    served.files.update(mini.served)
    params = _miniature_params(raw_params, "cnwl_cars", serve_archives(local_server, mini.archives), mini.expect,
                               "clean", {"kind": "none"})
    folder = _audited(params, "clean", tmp_path)
    judged = pd.read_csv(folder / "judged.csv")
    assert set(judged["detector"]) == {"method", "datalab", "confident_learning", "knn_disagreement"}
    assert (judged["rows"] == TRAIN_CLASSES * TRAIN_PER_CLASS).all()
    assert judged["noise_rate"].to_numpy() == pytest.approx(1 / TRAIN_PER_CLASS)
    suspects = pd.read_csv(folder / "sheet" / "suspects.csv")
    assert suspects["path"].str.contains("web_images/").sum() == 2 * TRAIN_CLASSES
    _sheet_images_resolve(folder)


def test_a_published_list_in_the_authors_format_is_judged_by_its_kept_list(tmp_path, raw_params, local_server):
    """The CUB miniature (CUB_200_2011.tgz) with noise from lists in the PRISM authors' format (``/data/``-prefixed
    paths, 1-based labels, gzip; noisy, kept and clean lists): the audit's truth is "absent from the kept list",
    and the sheet names the classes the run trained on."""
    import gzip
    import hashlib

    from conftest import serve_archives
    from noisydml.audit.run import training_class_names
    from noisydml.data.prepared import PreparedDataset
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.prepare import prepare
    from noisydml.pipeline.download import download
    from noisydml.tools.rehearsal import miniature

    base, served = local_server
    mini = miniature("cub200", base)
    archives = serve_archives(local_server, mini.archives)
    layout = Layout(tmp_path)
    first = _miniature_params(copy.deepcopy(raw_params), "cub200", archives, mini.expect, "clean", {"kind": "none"})
    download(first, "d", layout)
    prepare(first, "d", layout)
    manifest = PreparedDataset.load(layout.prepared("d"), layout.root).manifest
    train = manifest[manifest["split"] == "train"].reset_index(drop=True)
    rng = np.random.default_rng(0)
    classes = int(train["label"].max()) + 1
    flipped = rng.random(len(train)) < 0.3
    noisy_label = np.where(flipped, (train["label"] + rng.integers(1, classes, len(train))) % classes,
                           train["label"])
    paths = "/data/" + train["path"]

    def written(name: str, rows: pd.DataFrame) -> dict:
        text = "".join(f"{p},{c + 1}\n" for p, c in zip(rows["path"], rows["label"])).encode()
        (tmp_path / f"{name}.csv.gz").write_bytes(gzip.compress(text))
        return {"source": str(tmp_path / f"{name}.csv.gz"), "sha256": hashlib.sha256(text).hexdigest()}

    lists = {"strip_prefix": "/data/",
             "noisy_list": written("noisy", pd.DataFrame({"path": paths, "label": noisy_label})),
             "kept_list": written("kept", pd.DataFrame({"path": paths, "label": train["label"]})[~flipped]),
             "clean_list": written("clean", pd.DataFrame({"path": paths, "label": train["label"]}))}
    noise = {"kind": "published_list", "noise_model": "symmetric", "rate": 0.3, "lists": {"d": lists}}
    params = _miniature_params(copy.deepcopy(raw_params), "cub200", archives, mini.expect, "mini_sym30", noise)
    folder = _audited(params, "mini_sym30", tmp_path)
    judged = pd.read_csv(folder / "judged.csv").set_index("detector")
    assert (judged["rows"] == len(train)).all()
    assert judged["noise_rate"].to_numpy() == pytest.approx(flipped.mean())
    suspects = pd.read_csv(folder / "sheet" / "suspects.csv").head(8)  # the page's top 8
    shown = training_class_names(layout.run("d", "mini_sym30", "prism", 0))[suspects["given_label"]]
    assert set(shown) <= set(manifest["class_name"])  # every suspect's label named by its class
    page = (folder / "sheet" / "index.html").read_text()
    assert all(name in page for name in shown)
    _sheet_images_resolve(folder)


def test_the_retrain_study_judges_a_cleaned_listing_against_the_truth(tmp_path):
    """scripts/audit_retrain.py's judge of a cleaned listing: rows dropped and relabelled count as acted on; a
    relabel is right only to the true class; the wrong labels left are counted on the kept rows."""
    from conftest import load_script

    retrain = load_script("audit_retrain")
    noisy = pd.DataFrame({"path": [f"images/{k}.png" for k in range(6)] + ["images/t.png"],
                          "label": ["a", "a", "b", "b", "a", "b", "c"],
                          "split": ["train"] * 6 + ["test"], "is_clean": [1, 1, 1, 0, 0, 1, 1]})
    noisy.to_csv(tmp_path / "noisy.csv", index=False)
    truth = pd.DataFrame({"path": noisy["path"][:6], "true_class": ["a", "a", "b", "a", "b", "b"]})
    truth.to_csv(tmp_path / "truth.csv", index=False)
    # row 3 (wrong: b for a) relabelled to a, row 4 (wrong) dropped, row 5 (right) relabelled wrongly to a
    cleaned = noisy.drop(index=4).assign(label=["a", "a", "b", "a", "a", "c"])
    cleaned.assign(path=cleaned["path"].map(lambda p: f"/abs/{p}")).to_csv(tmp_path / "cleaned.csv", index=False)
    quality = retrain.cleaning_quality(tmp_path)
    assert quality["acted"] == 3 and quality["dropped"] == 1 and quality["relabelled"] == 2
    assert quality["precision"] == 2 / 3 and quality["recall"] == 1.0
    assert quality["relabelled_right"] == 1 and quality["wrong_left"] == 1
