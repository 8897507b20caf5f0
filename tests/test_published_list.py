"""The ``published_list`` noise kind on the PRISM authors' real lists (references/prism-datalist, MIT).

Fixture manifests are built from the authors' clean training lists' paths, so the statistics the kind reports
can be checked against what the lists themselves imply (rate, classes after, noisy count)."""

import copy
import gzip

import numpy as np
import pandas as pd
import pytest

from noisydml import io
from noisydml.data.prepared import write_prepared_files
from noisydml.noise import NoiseInputError, NoiseInputs, corrupt_labels
from noisydml.tools.check import validate_all
from noisydml.pipeline.corrupt import corrupt
from noisydml.pipeline.layout import Layout
from noisydml.schema import ParamsError

from conftest import REPO

LISTS = REPO / "references" / "prism-datalist"
SUMS = dict(line.split()[::-1] for line in (LISTS / "SHA256SUMS").read_text().splitlines())
SETTINGS = ["0.1noised", "0.2noised", "0.5noised", "0.25smallclusternoised", "0.5smallclusternoised"]


def spec(name: str) -> dict:
    return {"source": str(LISTS / f"{name}.csv.gz"), "sha256": SUMS[f"{name}.csv"]}


def read(name: str) -> pd.DataFrame:
    return pd.read_csv(LISTS / f"{name}.csv.gz", header=None, names=["path", "label"], sep=r",(?=[^,]*$)",
                       engine="python")


def lists(ds: str, setting: str, clean_list: bool = True) -> dict:
    return {"noisy_list": spec(f"{ds}_{setting}_train"), "kept_list": spec(f"{ds}_{setting}_cleaned_train"),
            "clean_list": spec(f"{ds}_train") if clean_list else None, "strip_prefix": "/data/"}


def cfg_for(ds: str, setting: str, clean_list: bool = True, dataset: str = "toy") -> dict:
    return {"kind": "published_list", "rate": float(setting.split("noised")[0].replace("smallcluster", "")),
            "noise_model": "small_cluster" if "smallcluster" in setting else "symmetric",
            "lists": {dataset: lists(ds, setting, clean_list)}}


def with_lists(cfg: dict, **changes) -> dict:
    return {**cfg, "lists": {"toy": {**cfg["lists"]["toy"], **changes}}}


def inputs(paths=None):
    return NoiseInputs(paths=paths, dataset="toy")


def test_sha256sums_match_the_copies():
    import hashlib

    for name, sha in SUMS.items():
        assert hashlib.sha256(gzip.decompress((LISTS / f"{name}.gz").read_bytes())).hexdigest() == sha, name


@pytest.mark.parametrize("ds", ["CUB", "CARS", "SOP"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_statistics_are_what_the_lists_imply(ds, setting):
    clean = read(f"{ds}_train")
    paths = clean["path"].str.slice(len("/data/")).to_numpy()
    true = np.searchsorted(np.unique(clean["label"]), clean["label"].to_numpy())
    table, per_class, stats = corrupt_labels(np.arange(len(paths)), true, cfg_for(ds, setting),
                                             inputs(paths))
    noisy, kept = read(f"{ds}_{setting}_train"), read(f"{ds}_{setting}_cleaned_train")
    # what the lists imply
    assert stats["num_samples"] == len(noisy) == len(clean)
    assert stats["num_noisy"] == len(noisy) - len(kept)
    assert stats["actual_rate"] == pytest.approx(1 - len(kept) / len(noisy))
    training_ids = set(clean["label"])
    outside = {str(label): int(count) for label, count in noisy["label"].value_counts().items()
               if "smallcluster" not in setting and label not in training_ids}
    assert stats["published_list"]["outside_training_classes"] == outside
    assert stats["num_classes_after"] == noisy["label"].nunique() - len(outside)
    assert stats["published_list"]["num_training_labels"] == noisy["label"].nunique() == table["label"].nunique()
    # the kind's labels group images exactly as the authors' labels do, and kept images keep their true class
    by_path = dict(zip(noisy["path"].str.slice(len("/data/")), noisy["label"]))
    authors = np.array([by_path[p] for p in paths])
    assert pd.crosstab(authors, table["label"]).astype(bool).sum().max() == 1
    assert pd.crosstab(table["label"], authors).astype(bool).sum().max() == 1
    kept_rows = table["is_noisy"] == 0
    assert (table.loc[kept_rows, "true_label"] == per_class.set_index("label").loc[
        table.loc[kept_rows, "label"], "true_label"].to_numpy()).all()


def test_paper_settings_known_figures():
    """The figures the issue and NOTES state: CUB's label 101 (6 and 28 images), small-cluster class counts."""
    clean = read("CUB_train")
    paths = clean["path"].str.slice(len("/data/")).to_numpy()
    true = clean["label"].to_numpy() - 1
    expected = {"0.2noised": ({"101": 6}, 100), "0.5noised": ({"101": 28}, 100),
                "0.25smallclusternoised": ({}, 75), "0.5smallclusternoised": ({}, 50)}
    for setting, (outside, classes_after) in expected.items():
        _, _, stats = corrupt_labels(np.arange(len(paths)), true, cfg_for("CUB", setting), inputs(paths))
        assert stats["published_list"]["outside_training_classes"] == outside
        assert stats["num_classes_after"] == classes_after


def test_sop_labels_without_kept_images_map_through_the_clean_list():
    clean = read("SOP_train")
    paths = clean["path"].str.slice(len("/data/")).to_numpy()
    true = np.searchsorted(np.unique(clean["label"]), clean["label"].to_numpy())
    _, _, stats = corrupt_labels(np.arange(len(paths)), true, cfg_for("SOP", "0.5noised"), inputs(paths))
    assert stats["published_list"]["label_map"]["by_clean_list"] > 0
    assert stats["published_list"]["outside_training_classes"] == {}
    # without the clean list those labels become classes of their own, and the run still works
    _, _, alone = corrupt_labels(np.arange(len(paths)), true, cfg_for("SOP", "0.5noised", clean_list=False),
                                 inputs(paths))
    assert alone["published_list"]["label_map"]["outside_training_classes"] == \
        stats["published_list"]["label_map"]["by_clean_list"]
    assert alone["num_noisy"] == stats["num_noisy"]


def _toy(n=3):
    clean = read("CUB_train")
    return clean["path"].str.slice(len("/data/")).to_numpy(), clean["label"].to_numpy() - 1


def test_errors_name_the_problem(tmp_path):
    paths, true = _toy()
    cfg = cfg_for("CUB", "0.2noised")
    with pytest.raises(NoiseInputError, match="sha256 [0-9a-f]{64}, expected 0{64}"):
        corrupt_labels(np.arange(len(paths)), true, with_lists(cfg, noisy_list={**cfg["lists"]["toy"]["noisy_list"], "sha256": "0" * 64}),
                       inputs(paths))
    # a manifest lacking images the list names: the error lists the first few
    with pytest.raises(NoiseInputError, match=r"3 of 5864 paths match no training image.*Black_Footed_Albatross_0046"):
        corrupt_labels(np.arange(len(paths) - 3), true[3:], cfg, inputs(paths[3:]))
    with pytest.raises(NoiseInputError, match="do not start with strip_prefix '/images/'"):
        corrupt_labels(np.arange(len(paths)), true, with_lists(cfg, strip_prefix="/images/"), inputs(paths))
    with pytest.raises(NoiseInputError, match="in-memory arrays without paths"):
        corrupt_labels(np.arange(len(paths)), true, cfg, inputs())
    with pytest.raises(NoiseInputError, match="not a pair"):
        corrupt_labels(np.arange(len(paths)), true, with_lists(cfg, kept_list=spec("CUB_0.5smallclusternoised_cleaned_train")),
                       inputs(paths))
    with pytest.raises(NoiseInputError, match="label list not found"):
        corrupt_labels(np.arange(len(paths)), true,
                       with_lists(cfg, noisy_list={"source": str(tmp_path / "none.csv"), "sha256": "0" * 64}),
                       inputs(paths))


def _files_dataset(layout: Layout, name: str) -> None:
    """A prepared, file-stored CUB whose paths are the authors' (train and test lists); no image is read."""
    train, test = read("CUB_train"), read("CUB_test")
    both = pd.concat([train.assign(split="train"), test.assign(split="test")], ignore_index=True)
    files = pd.DataFrame({"path": both["path"].str.slice(len("/data/")), "width": 500, "height": 375,
                          "sha256": "0" * 64})
    names = [str(c) for c in range(1, 201)]
    write_prepared_files(layout.prepared(name), files, "data/raw/cub200/files", both["label"].to_numpy() - 1, names,
                         {"kind": "test"}, split=both["split"].to_numpy())


def test_corrupt_stage_with_a_list_fetched_by_url(tmp_path, raw_params, local_server):
    base, served = local_server
    served.files["/CUB_0.5noised_train.csv"] = gzip.decompress((LISTS / "CUB_0.5noised_train.csv.gz").read_bytes())
    layout = Layout(tmp_path)
    _files_dataset(layout, "toy")
    raw = copy.deepcopy(raw_params)
    raw["datasets"]["toy"] = {"kind": "glyphs", "num_classes": 200, "images_per_class": 6}
    cfg = cfg_for("CUB", "0.5noised")
    cfg["lists"]["toy"]["noisy_list"]["source"] = f"{base}/CUB_0.5noised_train.csv"
    raw["noise"]["prism_sym50"] = cfg
    raw["grid"].update(datasets=["toy"], noises=["clean", "prism_sym50"], run_noises=[])
    raw["noise_runs"], raw["chains"] = {}, {}
    raw["timing"].update(noise="clean", dataset="toy")
    stats = corrupt(validate_all(raw), "toy", "prism_sym50", layout)
    assert stats["num_noisy"] == 5864 - 2951 and stats["published_list"]["outside_training_classes"] == {"101": 28}
    assert stats["nominal_rate"] == 0.5
    labels = pd.read_csv(layout.noisy("toy", "prism_sym50") / "labels.csv")
    assert labels["label"].nunique() == 101 and labels["is_noisy"].sum() == 2913
    assert io.read_json(layout.noisy("toy", "prism_sym50") / "stats.json")["published_list"]["noisy_list"][
        "lines"] == 5864


def test_params_refuse_a_bad_list_spec(raw_params):
    raw = copy.deepcopy(raw_params)
    raw["noise"]["bad"] = with_lists(cfg_for("CUB", "0.2noised"), kept_list={"source": "x.csv", "sha256": "abc"})
    with pytest.raises(ParamsError, match=r"noise.bad.lists.toy.kept_list.sha256: 'abc' is not a sha256"):
        validate_all(raw)
    raw["noise"]["bad"] = with_lists(cfg_for("CUB", "0.2noised"), kept_list="x.csv")
    with pytest.raises(ParamsError, match=r"noise.bad.lists.toy.kept_list: expected dict"):
        validate_all(raw)


def test_a_dataset_without_lists_is_named():
    paths, true = _toy()
    with pytest.raises(NoiseInputError, match="no lists for dataset 'cars196'; lists has: toy"):
        corrupt_labels(np.arange(len(paths)), true, cfg_for("CUB", "0.2noised"),
                       NoiseInputs(paths=paths, dataset="cars196"))


def test_an_unreachable_list_url_says_what_to_do():
    """Slow (6 s) by design: the downloader retries three times with 1, 2 and 3 s of back-off before it gives up,
    and the message after the retries is what this checks."""
    from noisydml.noise.published_list import read_list_bytes

    with pytest.raises(NoiseInputError, match=r"http://127.0.0.1:9/CUB.csv: cannot fetch the label list .*download "
                                              r"it by hand and give its path as source"):
        read_list_bytes("http://127.0.0.1:9/CUB.csv", timeout=2.0)
