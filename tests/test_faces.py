"""The face path: the real formats (RecordIO, insightface .bin, IJB meta), the verification protocols, and the
synthetic ``faces`` dataset's identities and noise truth."""

from __future__ import annotations

import pickle
from pathlib import Path
import struct

import numpy as np
import pandas as pd
import pytest

from noisydml.data import faces
from noisydml.data.face_formats import (ARCFACE_POINTS_112, RECORDIO_MAGIC, FaceRecordIO, IJBMeta, RecordIOReader,
                                        RecordIOWriter, align_face, encode_png, pack_record,
                                        read_verification_bin, similarity_transform, unpack_record,
                                        write_face_recordio, write_verification_bin)
from noisydml.data.registry import DATASET_KINDS, prepare_dataset
from noisydml.evaluation.verification import (pair_scores, tar_at_far, template_features, ten_fold_accuracy,
                                              wilson_interval)

SMALL = {"train_identities": 30, "test_identities": 6, "test_images": 4, "pairs_per_fold": 8,
         "ijb_identities": 12, "templates_per_identity": 3, "image_size": 16}


def small_cfg(**over) -> dict:
    return {"kind": "faces", **DATASET_KINDS["faces"].check({**SMALL, **over}, "datasets.faces")}


# ------------------------------------------------------------------------------------------------------ formats
def test_recordio_framing_matches_dmlc_byte_for_byte(tmp_path):
    """A 5-byte payload: magic, (flag 0 << 29 | 5), the bytes, 3 bytes of padding; the .idx line is key TAB 0."""
    with RecordIOWriter(tmp_path / "a.rec", tmp_path / "a.idx") as w:
        w.write(7, b"hello")
    raw = (tmp_path / "a.rec").read_bytes()
    assert raw == struct.pack("<II", RECORDIO_MAGIC, 5) + b"hello" + b"\0\0\0"
    assert (tmp_path / "a.idx").read_text() == "7\t0\n"


def test_recordio_splits_a_payload_holding_the_magic_word_and_reads_it_back(tmp_path):
    magic = struct.pack("<I", RECORDIO_MAGIC)
    payloads = [b"abcd" + magic + b"efgh" + magic + b"xy", magic, b"", b"z" * 13]
    with RecordIOWriter(tmp_path / "b.rec", tmp_path / "b.idx") as w:
        for k, p in enumerate(payloads):
            w.write(k, p)
    raw = (tmp_path / "b.rec").read_bytes()
    # the first record: parts of 4, 4 and 2 bytes with flags 1, 2, 3 (dmlc-core's continuation flags)
    assert struct.unpack_from("<II", raw, 0) == (RECORDIO_MAGIC, (1 << 29) | 4)
    assert struct.unpack_from("<II", raw, 12) == (RECORDIO_MAGIC, (2 << 29) | 4)
    assert struct.unpack_from("<II", raw, 24) == (RECORDIO_MAGIC, (3 << 29) | 2)
    with RecordIOReader(tmp_path / "b.rec") as r:
        assert [r.read(k) for k in (3, 0, 2, 1)] == [payloads[3], payloads[0], payloads[2], payloads[1]]


def test_irheader_pack_unpack_as_mxnet():
    scalar = pack_record(3.0, b"IMG", 9)
    assert scalar[:24] == struct.pack("<IfQQ", 0, 3.0, 9, 0)
    assert unpack_record(scalar) == (3.0, b"IMG")
    vector = pack_record([5, 8], b"")
    assert struct.unpack_from("<IfQQ", vector) == (2, 0.0, 0, 0)
    labels, body = unpack_record(vector)
    assert labels.tolist() == [5.0, 8.0] and body == b""


def test_face_recordio_round_trip_with_insightface_header_and_identity_records(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.array([0, 0, 1, 2, 2, 2])
    images = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in labels]
    write_face_recordio(tmp_path, labels, [encode_png(im) for im in images])
    rec = FaceRecordIO.open(tmp_path)
    assert rec.labels.tolist() == labels.tolist() and rec.image_keys.tolist() == [1, 2, 3, 4, 5, 6]
    assert all(np.array_equal(np.asarray(rec.image(i)), images[i]) for i in range(len(labels)))
    header, _ = unpack_record(rec.reader.read(0))
    assert header.tolist() == [7.0, 10.0]  # images 1..6, identity records 7..9
    assert unpack_record(rec.reader.read(9))[0].tolist() == [4.0, 7.0]  # identity 2: records [4, 7)
    with pytest.raises(ValueError, match="grouped by identity"):
        write_face_recordio(tmp_path, np.array([1, 0]), [b"", b""])


def test_bin_loads_as_insightface_loads_it(tmp_path):
    rng = np.random.default_rng(1)
    images = [encode_png(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)) for _ in range(6)]
    write_verification_bin(tmp_path / "lfw.bin", images, [True, False, True])
    with open(tmp_path / "lfw.bin", "rb") as f:  # insightface's own call
        bins, issame_list = pickle.load(f, encoding="bytes")
    assert isinstance(bins, list) and all(isinstance(b, bytes) for b in bins) and bins == images
    assert issame_list == [True, False, True]
    assert read_verification_bin(tmp_path / "lfw.bin")[1].tolist() == [True, False, True]
    with pytest.raises(ValueError, match="two per pair"):
        write_verification_bin(tmp_path / "x.bin", images[:5], [True, False, True])


def test_similarity_transform_recovers_a_known_one_and_alignment_of_reference_points_is_identity():
    angle, scale, shift = 0.3, 1.7, np.array([4.0, -2.0])
    rot = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    dst = ARCFACE_POINTS_112 @ rot.T + shift
    m = similarity_transform(ARCFACE_POINTS_112, dst)
    np.testing.assert_allclose(m[:, :2], rot, atol=1e-10)
    np.testing.assert_allclose(m[:, 2], shift, atol=1e-9)
    from PIL import Image

    image = np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    aligned = align_face(Image.fromarray(image), ARCFACE_POINTS_112 * 32 / 112, 32)
    np.testing.assert_array_equal(aligned, image)


def test_ijb_meta_round_trip_and_a_missing_template_is_named(tmp_path):
    images = pd.DataFrame({"image": ["1.png", "2.png"], "template": [10, 11], "media": [5, 6],
                           "landmarks": [ARCFACE_POINTS_112] * 2, "score": [0.9, 1.0]})
    IJBMeta(images, pd.DataFrame({"template1": [10], "template2": [11], "label": [0]})).write(tmp_path, "ijbc")
    back = IJBMeta.read(tmp_path, "ijbc")
    assert back.images["template"].tolist() == [10, 11] and back.pairs.values.tolist() == [[10, 11, 0]]
    np.testing.assert_allclose(back.images["landmarks"][1], ARCFACE_POINTS_112, atol=1e-4)
    (tmp_path / "meta" / "ijbc_template_pair_label.txt").write_text("10 99 1\n")
    with pytest.raises(ValueError, match="first: 99"):
        IJBMeta.read(tmp_path, "ijbc")


# ---------------------------------------------------------------------------------------------------- protocols
def test_ten_fold_accuracy_against_a_hand_computed_case():
    """20 pairs, 2 per fold. Distances: genuine 0.555, impostor 1.5, except pair 0 (genuine at 3.0). On every
    training split the best threshold is the smallest above 0.555 (0.56): all right but pair 0 when it trains.
    Fold 0 (pairs 0, 1) then scores 1/2, every other fold 2/2."""
    issame = np.array([True, False] * 10)
    dist = np.where(issame, 0.555, 1.5)
    dist[0] = 3.0
    feats = np.zeros((40, 16))
    for p, dd in enumerate(dist):
        theta = np.arccos(1 - dd / 2)  # |a - b|^2 = 2 - 2 cos theta for unit a, b
        feats[2 * p, 0] = 1.0
        feats[2 * p + 1, :2] = [np.cos(theta), np.sin(theta)]
    result = ten_fold_accuracy(feats, issame)
    assert result.folds.tolist() == [0.5] + [1.0] * 9
    np.testing.assert_allclose(result.thresholds, 0.56)
    assert result.mean == pytest.approx(0.95) and result.std == pytest.approx(np.std([0.5] + [1.0] * 9))


def test_tar_at_far_against_sklearn_roc_curve():
    from sklearn.metrics import roc_curve

    rng = np.random.default_rng(3)
    labels = np.r_[np.ones(500), np.zeros(20000)].astype(int)
    scores = np.round(np.r_[rng.normal(1.0, 1.0, 500), rng.normal(-1.0, 1.0, 20000)], 2)  # ties on purpose
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    for r in tar_at_far(scores, labels, (1e-3, 1e-2, 0.1)):
        best = np.flatnonzero(fpr <= r.far + 1e-12).max()  # the largest ROC point with FAR <= f
        assert r.tar == pytest.approx(tpr[best]) and r.false_accepts / r.impostors == pytest.approx(fpr[best])
        assert r.false_accepts <= r.far * r.impostors
        assert r.tar_low <= r.tar <= r.tar_high


def test_wilson_interval_known_value():
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)


def test_template_pooling_is_media_mean_summed_then_normalised():
    feats = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 0.0], [0.0, 2.0]])
    ids, pooled = template_features(feats, np.array([7, 7, 7, 8]), np.array([1, 1, 2, 3]))
    expected = np.array([0.5, 0.5]) + np.array([3.0, 0.0])  # media 1's mean + media 2
    np.testing.assert_allclose(pooled[0], expected / np.linalg.norm(expected))
    np.testing.assert_allclose(pooled[1], [0.0, 1.0])
    assert ids.tolist() == [7, 8]
    np.testing.assert_allclose(pair_scores(ids, pooled, np.array([7]), np.array([8]), chunk=1),
                               expected[1] / np.linalg.norm(expected))


# ------------------------------------------------------------------------------------------- the synthetic set
def test_identities_are_seeded_and_roles_disjoint():
    assert faces.identity("train", 3) == faces.identity("train", 3)
    assert faces.identity("train", 3) != faces.identity("lfw", 3)
    a = faces.render(faces.identity("train", 3), faces.Nuisance(), 24)
    assert a.shape == (24, 24, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, faces.render(faces.identity("train", 3), faces.Nuisance(), 24))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("faces")
    cfg = small_cfg(train_identities=60, flip_rate=0.2, distractor_rate=0.1, junk_rate=0.05, conflict_rate=0.2,
                    duplicate_rate=0.05)
    info = prepare_dataset("faces", cfg, root / "faces")
    return root / "faces", cfg, info


def test_noise_truth_rates_match_the_settings(prepared):
    folder, cfg, info = prepared
    manifest = pd.read_csv(folder / "manifest.csv")
    truth = pd.read_csv(folder / "noise_truth.csv", keep_default_na=False)
    train = truth[manifest["split"] == "train"]
    kinds = train["noise_kind"].value_counts()
    base = int(train["noise_kind"].isin(["clean", "conflict", "flip"]).sum())  # the rendered images
    assert kinds["flip"] / base == pytest.approx(cfg["flip_rate"], abs=0.06)  # conflicted images are not flipped
    for kind in ("distractor", "junk", "duplicate"):
        assert kinds[kind] == round(cfg[f"{kind}_rate"] * base)
    split_identities = train.loc[train["noise_kind"] == "conflict", "true_identity"].nunique()
    assert split_identities == round(cfg["conflict_rate"] * cfg["train_identities"])
    # a flip's label is another training identity; a conflict's label is its identity's second label
    flips = train[train["noise_kind"] == "flip"]
    assert (flips["label_name"] != flips["true_identity"]).all()
    conflicts = train[train["noise_kind"] == "conflict"]
    assert (conflicts["label_name"] == conflicts["true_identity"] + "b").all()
    assert (train.loc[train["noise_kind"] == "junk", "true_identity"] == "").all()
    # the manifest's flags are the truth's (duplicates carry the right label)
    clean = manifest.loc[manifest["split"] == "train", "is_clean"].to_numpy()
    np.testing.assert_array_equal(clean, train["noise_kind"].isin(["clean", "duplicate"]).to_numpy())


def test_evaluation_sets_are_identity_disjoint_from_training(prepared):
    folder, cfg, info = prepared
    truth = pd.read_csv(folder / "noise_truth.csv", keep_default_na=False)
    manifest = pd.read_csv(folder / "manifest.csv")
    trained = set(truth.loc[manifest["split"] == "train", "true_identity"]) - {""}
    tested = set(truth.loc[manifest["split"] == "test", "true_identity"])
    assert trained and tested and not trained & tested
    assert not set(manifest.loc[manifest["split"] == "train", "label"]) & set(
        manifest.loc[manifest["split"] == "test", "label"])
    seen = trained | tested
    for which in faces.VERIFICATION_SETS:
        pairs = pd.read_csv(folder / "verification" / f"{which}_pairs.csv")
        assert not (set(pairs["identity1"]) | set(pairs["identity2"])) & seen
        bins, issame = read_verification_bin(folder / "verification" / f"{which}.bin")
        assert len(issame) == 10 * cfg["pairs_per_fold"] and issame.mean() == 0.5
        assert (issame == pairs["issame"].to_numpy()).all()
    ijb = pd.read_csv(folder / "verification" / "IJB" / "identities.csv")
    assert not set(ijb["identity"]) & seen


def test_ijb_set_lists_every_template_pair(prepared):
    folder, cfg, info = prepared
    meta = IJBMeta.read(folder / "verification" / "IJB", "ijb")
    templates = cfg["ijb_identities"] * cfg["templates_per_identity"]
    assert len(meta.pairs) == templates * (templates - 1) // 2
    per_identity = cfg["templates_per_identity"] * (cfg["templates_per_identity"] - 1) // 2
    assert meta.pairs["label"].sum() == cfg["ijb_identities"] * per_identity
    assert info["source_counts"]["ijb_impostor_pairs"] == len(meta.pairs) - meta.pairs["label"].sum()


def test_cleaned_twin_has_no_noise_and_merges_conflicts(tmp_path):
    cfg = small_cfg(variant="cleaned", conflict_rate=0.3)
    info = prepare_dataset("faces_clean", cfg, tmp_path / "c")
    truth = pd.read_csv(tmp_path / "c" / "noise_truth.csv", keep_default_na=False)
    assert set(truth["noise_kind"]) == {"clean"}
    assert info["num_train_classes"] == cfg["train_identities"]
    manifest = pd.read_csv(tmp_path / "c" / "manifest.csv")
    assert manifest["is_clean"].eq(1).all()


@pytest.mark.parametrize("over, message", [
    ({"source": "local"}, "local_dir: '' but source is 'local'"),
    ({"pairs_per_fold": 7}, "pairs_per_fold: 7 is odd"),
    ({"min_images": 9, "max_images": 5}, "max_images: 5 is below min_images"),
    ({"local_dir": "x"}, "read only with source: local"),
    ({"source": "local", "local_dir": "x"}, r"release: 'synthetic' with source 'local'; allowed: ms1mv0, "),
    ({"release": "ms1mv2"}, "release: 'ms1mv2' with source 'synthetic'; allowed: synthetic"),
    ({"source": "local", "local_dir": "x", "release": "ms1mv0", "variant": "cleaned"},
     "variant: 'cleaned', but release 'ms1mv0' is the noisy set; allowed: noisy"),
    ({"storage": "files"}, "storage"),
])
def test_bad_faces_params_are_named(over, message):
    with pytest.raises(ValueError, match=message):
        small_cfg(**over)


def test_local_source_reads_insightface_files(prepared, tmp_path):
    """The local reader on a faces_emore-like folder (train.rec/.idx + .bin sets, no truth): what the synthetic
    source wrote, minus its truth, read as real data is read."""
    import shutil

    folder, cfg, info = prepared
    src = tmp_path / "emore"
    src.mkdir()
    faces.write_source(src, {**cfg, "train_identities": 12, "ijb_identities": 3})
    (src / "truth.csv").unlink()
    (src / "identities.csv").unlink()
    shutil.rmtree(src / "IJB")
    local = small_cfg(source="local", local_dir=str(src), test_identities=4, release="unchecked", storage="arrays")
    out = prepare_dataset("emore", local, tmp_path / "prepared")
    manifest = pd.read_csv(tmp_path / "prepared" / "manifest.csv")
    assert "is_clean" not in manifest and info and out["num_test_classes"] == 4  # real data: no truth
    assert sorted(p.name for p in (tmp_path / "prepared" / "verification").glob("*.bin")) == [
        "agedb_30.bin", "cfp_fp.bin", "lfw.bin"]


def test_verification_features_and_metrics_from_a_prepared_folder(prepared):
    from noisydml.pipeline.face_eval import verification_metrics
    from noisydml.pipeline.face_features import verification_embeddings

    folder, cfg, info = prepared

    def pixels(images):  # raw pixels as features: the plumbing, not a model
        return images.reshape(len(images), -1).astype(float)

    saved = verification_embeddings(pixels, folder)
    assert set(saved) == ({f"{s}_{k}" for s in faces.VERIFICATION_SETS for k in ("image", "flip", "issame")}
                          | {"ijb_image", "ijb_flip"})
    assert saved["lfw_image"].shape[0] == 2 * 10 * cfg["pairs_per_fold"]
    # a flip permutes pixels: the same sums, other features
    np.testing.assert_allclose(saved["lfw_flip"].sum(1), saved["lfw_image"].sum(1))
    assert not np.array_equal(saved["lfw_flip"], saved["lfw_image"])
    assert len(saved["ijb_image"]) == info["source_counts"]["ijb_images"]
    metrics = verification_metrics(saved, folder)
    impostors = info["source_counts"]["ijb_impostor_pairs"]
    for name in faces.VERIFICATION_SETS:
        assert 40 <= metrics[f"{name}_accuracy"] <= 100
    assert metrics["tar_at_far_0.001_false_accepts"] <= 0.001 * impostors
    assert metrics["tar_at_far_0.001_low"] <= metrics["tar_at_far_0.001"] <= metrics["tar_at_far_0.001_high"]
    assert metrics["tar_at_far_0.001"] == metrics["tar_at_far_0.001_strict"] and "tar_at_far_0.001_insightface" in metrics
    assert verification_metrics(saved, folder, "insightface")["tar_at_far_0.001"] == metrics["tar_at_far_0.001_insightface"]
    for name in faces.VERIFICATION_SETS:  # insightface's VAL at FAR 1e-3 beside the accuracy
        assert 0 <= metrics[f"{name}_val_at_far"] <= 100 and metrics[f"{name}_val_far"] >= 0
    # the synthetic IJB meta's detector scores vary (a turned, blurred or side-lit face scores lower), so
    # insightface's detector weighting is exercised
    meta = IJBMeta.read(Path(folder) / "verification" / "IJB", info.get("ijb_name", "ijbc"))
    assert meta.images["score"].between(0.3, 1.0).all() and meta.images["score"].std() > 0.05


def test_published_iresnet_weights_are_evaluated_as_published(prepared, tmp_path):
    """``noisydml verify``: an arcface_torch-layout state dict loads into the iResNet by key, its raw 512-d output
    (no head of ours, no normalisation) reaches the protocols, images scaled as arcface_torch scales them."""
    import torch

    from noisydml.models import BACKBONES
    from noisydml.pipeline.face_features import verification_embeddings
    from noisydml.tools.verify_weights import load_published, main, published_embedder

    folder, cfg, info = prepared
    torch.manual_seed(0)
    net = BACKBONES["iresnet18"](3, {"pooling": "avg", "iresnet_width": 64}).eval()
    torch.save(net.state_dict(), tmp_path / "backbone.pth")
    loaded = load_published("iresnet18", tmp_path / "backbone.pth")
    saved = verification_embeddings(published_embedder(loaded, torch.device("cpu")), folder)
    assert saved["lfw_image"].shape[1] == 512 and not np.allclose(np.linalg.norm(saved["lfw_image"], axis=1), 1.0)
    first = saved["lfw_image"][:2]
    with torch.no_grad():  # the network's own output on arcface_torch's input scaling
        from noisydml.data.face_formats import decode_images, read_verification_bin

        bins, _ = read_verification_bin(Path(folder) / "verification" / "lfw.bin")
        x = torch.from_numpy(decode_images(bins[:2], info["image_shape"][0])).permute(0, 3, 1, 2).float()
        expected = net((x / 255.0 - 0.5) / 0.5).numpy()  # random weights: outputs of ~1e5, float32 batch noise
        np.testing.assert_allclose(first, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    with pytest.raises(SystemExit, match="allowed: iresnet18"):
        load_published("resnet50", tmp_path / "backbone.pth")
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match="missing"):
        load_published("iresnet18", tmp_path / "other.pth")


def test_a_face_run_trains_and_evaluates_with_verification_beside_retrieval(raw_params, tmp_path):
    """prepare -> corrupt -> train -> evaluate on a tiny faces set: the run keeps its verification features and
    its metrics hold the protocols' numbers beside P@1."""
    from conftest import tiny_params
    from noisydml.config import validate_params
    from noisydml.pipeline.corrupt import corrupt
    from noisydml.pipeline.evaluate import evaluate_run
    from noisydml.pipeline.face_features import VERIFICATION_EMBEDDINGS
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.prepare import prepare
    from noisydml.pipeline.train import train
    from noisydml.runs import GRID, Run

    raw = tiny_params(raw_params)
    raw["datasets"]["faces"].update(SMALL, train_identities=12, ijb_identities=4)
    raw["grid"].update(datasets=["faces"], noises=["clean"], methods=["normalized_softmax"], seeds=[0])
    raw["chains"] = {}
    raw["timing"].update(dataset="faces", noise="clean")
    params = validate_params(raw)
    layout = Layout(tmp_path)
    prepare(params, "faces", layout)
    corrupt(params, "faces", "clean", layout)
    out = train(params, Run(GRID, "faces-clean-normalized_softmax-0", "faces", "clean", "normalized_softmax", 0,
                            "normalized_softmax"), layout)
    assert (out / VERIFICATION_EMBEDDINGS).is_file()
    metrics = evaluate_run(params, "faces", "clean", "normalized_softmax", 0, layout)["metrics"]
    assert {"precision_at_1", "lfw_accuracy", "cfp_fp_accuracy", "agedb_30_accuracy", "tar_at_far_1e-05"} <= set(metrics)


def test_the_report_shows_verification_beside_p_at_1_only_for_face_runs():
    from noisydml.reporting.tables import verification_markdown

    summary = pd.DataFrame({"dataset": ["glyphs", "faces"], "noise": ["clean", "clean"], "method": ["ms", "ms"],
                            "seeds": [3, 3], "precision_at_1": [0.9, 0.95], "precision_at_1_std": [0.01, 0.02],
                            "lfw_accuracy": [np.nan, 97.5], "lfw_accuracy_std": [np.nan, 0.25],
                            "tar_at_far_1e-05": [np.nan, 24.3], "tar_at_far_1e-05_std": [np.nan, 1.0],
                            "tar_at_far_1e-05_false_accepts": [np.nan, 11.0],
                            "tar_at_far_1e-05_identities_low": [np.nan, 18.5],
                            "tar_at_far_1e-05_identities_high": [np.nan, 30.25]})
    text = "\n".join(verification_markdown(summary, {"ms": "MS"}, {("faces", "clean"): "real noise"}))
    assert "| faces     | real noise      | MS       | 3       | 95.00 ± 2.00 | 97.50 ± 0.25" in text
    assert "glyphs" not in text and "rests on 11 false accepts" in text
    assert "MS [18.50, 30.25]" in text  # the identities' interval (columns no attribute name can hold)
    assert verification_markdown(summary.drop(columns=["lfw_accuracy", "tar_at_far_1e-05"]), {}, {}) == []


def test_ijb_scoring_keeps_feature_norms_and_weights_by_detector_score(tmp_path):
    """insightface's default IJB test: flip-summed features, not normalised, times the detector score, media mean,
    template sum. Template 1 = one media of two frames a = [10, 0] and b = [0, 1]; template 2 = [1, 0] (the same
    person), template 3 = [1, 1] (another). Norms kept, template 1 points along a and the genuine pair wins (TAR
    100 at any FAR); normalising each image, or a detector score of 0.1 on a, turns template 1 to the diagonal
    and the impostor wins (TAR 0)."""
    from noisydml import io
    from noisydml.pipeline.face_eval import verification_metrics

    folder = tmp_path / "verification" / "IJB"
    io.write_json(tmp_path / "info.json", {"ijb_name": "ijb", "image_shape": [8, 8, 3]})
    features = np.array([[10.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    saved = {"ijb_image": features, "ijb_flip": np.zeros_like(features)}
    pairs = pd.DataFrame({"template1": [1, 1], "template2": [2, 3], "label": [1, 0]})

    def tar(scores):
        images = pd.DataFrame({"image": ["a.png", "b.png", "c.png", "d.png"], "template": [1, 1, 2, 3],
                               "media": [7, 7, 8, 9], "landmarks": [ARCFACE_POINTS_112] * 4, "score": scores})
        IJBMeta(images, pairs).write(folder, "ijb")
        return verification_metrics(saved, tmp_path)["tar_at_far_0.001"]

    assert tar([1.0, 1.0, 1.0, 1.0]) == 100.0
    assert tar([0.1, 1.0, 1.0, 1.0]) == 0.0


# ------------------------------------------------------------------------------------ the face sets at their size
def jpeg_records(folder, identities: int, per_identity: int, size: int = 112, header_only=None):
    """A ``train.rec`` of ``identities x per_identity`` JPEGs (16 distinct encodings, reused: what is measured is
    the reading, not the pictures); ``header_only=(images, identities)``: record 0 alone, declaring those counts."""
    import io as _io

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    if header_only is not None:
        images, ids = header_only
        with RecordIOWriter(folder / "train.rec", folder / "train.idx") as w:
            w.write(0, pack_record([images + 1, images + 1 + ids], b""))
        return folder
    pool = []
    for k in range(16):
        ramp = (np.add.outer(np.arange(size), np.arange(size)) * (k + 1) % 256).astype(np.uint8)
        buf = _io.BytesIO()
        Image.fromarray(np.stack([ramp, ramp[::-1], ramp.T], -1)).save(buf, format="JPEG", quality=90)
        pool.append(buf.getvalue())
    labels = np.repeat(np.arange(identities), per_identity)
    write_face_recordio(folder, labels, [pool[i % len(pool)] for i in range(len(labels))])
    return folder


LOADER_UNDER_CAP = """
import resource, sys
import numpy as np
import torch
torch.set_num_threads(1)
from pathlib import Path
from noisydml.data.face_formats import FaceRecordIO
from noisydml.data.images import ImageRecords, InputPipeline
folder, cap, workers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rec = FaceRecordIO.open(folder)
records = ImageRecords(folder / "train.rec", rec.offsets, np.arange(len(rec)), 112)
pipe = InputPipeline(workers=workers)
batches = [np.arange(i, min(i + 64, len(records))) for i in range(0, len(records), 64)]
next(iter(pipe.train_batches(records, batches[:1], 0)))  # the decoders and the workers started
size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + cap, size + cap))  # from here, at most `cap` more bytes mapped
seen = checksum = 0
for x in pipe.train_batches(records, batches, 0):
    seen += len(x)
    checksum += float(x[:, :, 0, 0].sum())
print(seen, checksum)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_records_are_read_through_the_loader_under_a_memory_cap_smaller_than_the_decoded_set(tmp_path, workers):
    """4,000 112-px faces (144 MiB decoded) read by the training loader, in a process whose address space may grow by
    64 MiB only (RLIMIT_AS): nothing of the set's size is held. With workers, glibc's dynamic mmap threshold lets
    the parent keep freed batch buffers (up to ~0.5 GB on this set, measured; it does not grow with the set), so that
    run fixes the threshold, as a training process short of memory would (MALLOC_MMAP_THRESHOLD_)."""
    import os
    import subprocess
    import sys

    folder = jpeg_records(tmp_path / "rec", identities=200, per_identity=20)
    decoded = 4000 * 112 * 112 * 3
    cap = 64 * 2**20
    assert cap < decoded / 2
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", **({"MALLOC_MMAP_THRESHOLD_": "131072"} if workers else {})}
    out = subprocess.run([sys.executable, "-c", LOADER_UNDER_CAP, str(folder), str(cap), str(workers)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen, checksum = out.stdout.split()
    assert int(seen) == 4000
    # the same pixels as decoding the records one by one (the first pixel's channels of every image)
    rec = FaceRecordIO.open(folder)
    expected = sum(float(((np.asarray(rec.image(i))[0, 0].astype(np.float32) / 127.5) - 1.0).sum())
                   for i in range(len(rec)))
    assert float(checksum) == pytest.approx(expected, rel=1e-6)


def test_faces_in_records_give_the_networks_the_same_inputs_as_arrays(tmp_path):
    """The same synthetic set prepared both ways: records decoded per batch (0 and 2 loader workers) equal the arrays
    bit for bit, in training and evaluation batches, strides included (a convolution's algorithm follows them)."""
    import torch

    from noisydml.data.images import ImageRecords, InputPipeline
    from noisydml.data.prepared import PreparedDataset

    cfg = small_cfg(train_identities=12)
    arrays = prepare_dataset("faces", {**cfg, "storage": "arrays"}, tmp_path / "a")
    records = prepare_dataset("faces", {**cfg, "storage": "records"}, tmp_path / "r")
    assert records["storage"] == "records" and not (tmp_path / "r" / "images.npy").exists()
    assert {k: v for k, v in arrays.items() if k not in ("storage", "images_sha256")} == {
        k: v for k, v in records.items() if k not in ("storage", "images_sha256", "records_file", "records_in")}
    a, r = PreparedDataset.load(tmp_path / "a"), PreparedDataset.load(tmp_path / "r")
    assert isinstance(r.images, ImageRecords) and r.decoded_per_batch
    pd.testing.assert_frame_equal(a.manifest[["sample_id", "label", "split"]].astype({"split": str}),
                                  r.manifest[["sample_id", "label", "split"]].astype({"split": str}))
    rows = [np.arange(0, 7), np.arange(30, 41)]
    for workers in (0, 2):
        pipe = InputPipeline(workers=workers)
        for x, y in zip(pipe.train_batches(np.asarray(a.images), rows, 0), pipe.train_batches(r.images, rows, 0)):
            assert torch.equal(x, y) and x.stride() == y.stride()
        for x, y in zip(pipe.eval_batches(np.asarray(a.images), 50), pipe.eval_batches(r.images, 50)):
            assert torch.equal(x, y) and x.stride() == y.stride()


def test_an_ms1mv0_row_refuses_a_folder_that_holds_the_refined_release(tmp_path):
    """record 0 of insightface's faces_ms1m (the refined MS1M-IBUG: 3,804,846 images, ~85K identities) under a
    profile's MS1MV0 row: refused before any image is read, naming what was found, what MS1MV0 holds, and which
    release the folder is."""
    from noisydml.data import DatasetError

    folder = jpeg_records(tmp_path / "faces_ms1m", 0, 0, header_only=(3_804_846, 85_164))
    cfg = small_cfg(source="local", local_dir=str(folder), release="ms1mv0", variant="noisy")
    with pytest.raises(DatasetError) as refused:
        prepare_dataset("ms1mv0", cfg, tmp_path / "prepared")
    text = str(refused.value)
    assert "declares 3,804,846 images of 85,164 identities, but release is 'ms1mv0'" in text
    assert "8,000,000-11,000,000 images of 95,000-101,000 identities" in text
    assert "those are the counts of 'ms1m_refined'" in text and "faces_ms1m_full" in text
    assert not (tmp_path / "prepared").exists()


@pytest.mark.parametrize("release", list(faces.FACE_RELEASES))
def test_the_release_check_has_a_case_per_release(release):
    """Each release's own counts pass; each other release's counts are refused naming them."""
    from noisydml.data import DatasetError

    spec = faces.FACE_RELEASES[release]
    cfg = {"release": release}
    assert faces.check_release("x", cfg, spec.images[0], spec.identities[1])["release_counts"] == {
        "images": spec.images[0], "identities": spec.identities[1]}
    for other, them in faces.FACE_RELEASES.items():
        if other == release:
            continue
        with pytest.raises(DatasetError, match=f"those are the counts of '{other}'"):
            faces.check_release("x", cfg, them.images[0], them.identities[0])
    with pytest.raises(DatasetError, match="no known release has those counts"):
        faces.check_release("x", cfg, 1234, 56)


def test_labels_come_from_the_identity_records_and_a_mislabelled_range_is_named(tmp_path):
    folder = jpeg_records(tmp_path / "ok", identities=5, per_identity=3, size=16)
    rec = FaceRecordIO.open(folder)
    assert rec.declared == (15, 5) and rec.labels.tolist() == np.repeat(np.arange(5), 3).tolist()
    assert len(rec.offsets) == 15 and (np.diff(rec.offsets) > 0).all()
    # identity 1's images carry label 7 in their own headers: the ranges and the headers disagree
    from noisydml.data import DatasetError

    bad = tmp_path / "bad"
    bad.mkdir()
    with RecordIOWriter(bad / "train.rec", bad / "train.idx") as w:
        w.write(0, pack_record([5, 7], b""))
        for key, label in enumerate([0, 0, 7, 7], start=1):
            w.write(key, pack_record(float(label), b"x", key))
        w.write(5, pack_record([1, 3], b""))
        w.write(6, pack_record([3, 5], b""))
    with pytest.raises(DatasetError, match="record 3 is labelled 7 in its header but lies in identity 1's range"):
        FaceRecordIO.open(bad)


def test_verification_features_are_read_a_block_at_a_time_and_equal_one_pass(prepared):
    """IJB-C's 469,375 crops and their flips were held at once (2 x 17.7 GB); now a block and its flip are the only
    images alive, and the features are those of one pass."""
    from noisydml.pipeline.face_features import verification_embeddings

    folder, cfg, info = prepared
    largest = []

    def pixels(images):
        largest.append(len(images))
        return images.reshape(len(images), -1).astype(np.float32)

    blocked = verification_embeddings(pixels, folder, block=7)
    assert max(largest) == 7
    largest.clear()
    whole = verification_embeddings(pixels, folder, block=10**9)
    assert max(largest) == max(info["source_counts"]["ijb_images"], 2 * 10 * cfg["pairs_per_fold"]) > 7
    assert set(blocked) == set(whole)
    for key in whole:
        np.testing.assert_array_equal(blocked[key], whole[key])


def test_tar_interval_over_identities_resamples_whole_identities():
    """The identities come from the genuine pairs; the bootstrap interval holds the point TAR and is wider than
    the Wilson interval over pairs when identities differ (here: each identity's genuine scores shifted by its own
    amount, as real identities are easier or harder)."""
    from noisydml.evaluation.verification import tar_interval_over_identities, template_identities

    rng = np.random.default_rng(0)
    identities, per = 40, 4
    templates = np.arange(identities * per)
    who = templates // per
    t1, t2 = np.array([(a, b) for a in templates for b in templates if a < b]).T
    labels = (who[t1] == who[t2]).astype(int)
    shift = rng.normal(0, 1.0, identities)
    scores = np.where(labels == 1, 2.0 + shift[who[t1]] + rng.normal(0, 0.3, len(t1)), rng.normal(0, 0.5, len(t1)))
    found = template_identities(t1, t2, labels)
    assert len(set(found.values())) == identities and all(found[t] == found[t - t % per] for t in templates)
    (point,) = tar_at_far(scores, labels, (1e-3,))
    interval = tar_interval_over_identities(scores, labels, t1, t2, (1e-3,), resamples=300)[1e-3]
    assert interval[0] <= point.tar <= interval[1]
    assert interval[1] - interval[0] > 1.5 * (point.tar_high - point.tar_low)
    assert tar_interval_over_identities(scores, labels, t1, t2, (1e-3,), resamples=300)[1e-3] == interval  # seeded
