import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from noisydml.data import glyphs
from noisydml.data import DatasetError
from noisydml.data.folder import load_folder_dataset
from noisydml.data.prepared import PreparedDataset, write_prepared


def test_glyph_classes_are_distinct_and_plentiful():
    chars = glyphs.available_chars()
    assert len(chars) >= 400
    assert len(set(chars)) == len(chars)
    # Latin A, Greek Alpha and Cyrillic A share outlines: only the first is a class.
    assert "A" in chars and "\u0391" not in chars and "\u0410" not in chars


def test_glyphs_are_deterministic_by_seed():
    a = glyphs.generate(6, 3, 16, seed=1)
    b = glyphs.generate(6, 3, 16, seed=1)
    c = glyphs.generate(6, 3, 16, seed=2)
    assert np.array_equal(a[0], b[0]) and a[2] == b[2]
    assert not np.array_equal(a[0], c[0])
    images, labels, names = a
    assert images.shape == (18, 16, 16, 1) and images.dtype == np.uint8
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]
    assert len(names) == 6 and all(n.startswith("U+") for n in names)
    assert images.reshape(18, -1).max(axis=1).min() > 100, "every image shows ink"


def test_prepared_split_is_class_disjoint(tmp_path):
    images, labels, names = glyphs.generate(6, 3, 16, seed=0)
    info = write_prepared(tmp_path / "ds", images, labels, names, {"kind": "glyphs"})
    ds = PreparedDataset.load(tmp_path / "ds")
    train, test = ds.split("train"), ds.split("test")
    assert set(train["label"]) == {0, 1, 2} and set(test["label"]) == {3, 4, 5}
    assert info["num_train_samples"] == 9 and len(info["images_sha256"]) == 64


def _png(path, value=128, size=10):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(path)


def _tree(root, classes=4, per_class=2):
    for c in range(classes):
        for i in range(per_class):
            _png(root / f"class{c}" / f"{i}.png", value=10 * c + i)


def test_folder_dataset_reads_class_folders(tmp_path):
    _tree(tmp_path / "imgs")
    images, labels, names, _, _ = load_folder_dataset({"root": "imgs", "csv": "", "image_size": 8, "channels": 1}, tmp_path)
    assert images.shape == (8, 8, 8, 1)
    assert names == ["class0", "class1", "class2", "class3"]
    assert labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_folder_dataset_reads_csv(tmp_path):
    _tree(tmp_path / "imgs")
    rows = ["path,label"] + [f"imgs/class{c}/{i}.png,c{c}" for c in range(4) for i in range(2)]
    (tmp_path / "list.csv").write_text("\n".join(rows))
    images, labels, names, _, _ = load_folder_dataset({"root": "", "csv": "list.csv", "image_size": 8, "channels": 3}, tmp_path)
    assert images.shape == (8, 8, 8, 3) and names == ["c0", "c1", "c2", "c3"]


def test_folder_csv_verification_flags_reach_the_manifest(tmp_path):
    from noisydml.data.prepared import PreparedDataset, write_prepared

    _tree(tmp_path / "imgs")
    flags = ["1", "0", "", "1", "", "", "0", ""]
    rows = ["path,label,is_clean"] + [
        f"imgs/class{c}/{i}.png,c{c},{flags[2 * c + i]}" for c in range(4) for i in range(2)
    ]
    (tmp_path / "list.csv").write_text("\n".join(rows))
    cfg = {"root": "", "csv": "list.csv", "image_size": 8, "channels": 3}
    images, labels, names, is_clean, _ = load_folder_dataset(cfg, tmp_path)
    assert np.array_equal(is_clean, [1, 0, np.nan, 1, np.nan, np.nan, 0, np.nan], equal_nan=True)
    write_prepared(tmp_path / "ds", images, labels, names, {"kind": "folder"}, is_clean=is_clean)
    manifest = PreparedDataset.load(tmp_path / "ds").manifest
    assert manifest["is_clean"].isna().tolist() == [False, False, True, False, True, True, False, True]
    assert manifest["is_clean"].dropna().tolist() == [1, 0, 1, 0]
    (tmp_path / "list.csv").write_text("\n".join(rows[:3] + ["imgs/class1/0.png,c1,yes"] + rows[4:]))
    with pytest.raises(DatasetError, match=r"line 4: is_clean is 'yes'"):
        load_folder_dataset(cfg, tmp_path)


def test_folder_errors_name_the_file(tmp_path):
    _tree(tmp_path / "imgs")
    cfg = {"root": "imgs", "csv": "", "image_size": 8, "channels": 3}
    (tmp_path / "imgs" / "class1" / "1.png").write_bytes(b"not an image")
    with pytest.raises(DatasetError, match=r"cannot read image .*class1/1\.png"):
        load_folder_dataset(cfg, tmp_path)
    (tmp_path / "imgs" / "class1" / "1.png").unlink()
    with pytest.raises(DatasetError, match=r"class 'class1' has a single image .*class1/0\.png"):
        load_folder_dataset(cfg, tmp_path)
    (tmp_path / "imgs" / "class9").mkdir()
    with pytest.raises(DatasetError, match=r"class folder .*class9 is empty"):
        load_folder_dataset(cfg, tmp_path)


def test_folder_csv_missing_file(tmp_path):
    _tree(tmp_path / "imgs")
    rows = ["path,label"] + [f"imgs/class{c}/{i}.png,c{c}" for c in range(4) for i in range(2)] + ["imgs/gone.png,c0"]
    (tmp_path / "list.csv").write_text("\n".join(rows))
    with pytest.raises(DatasetError, match=r"image .*imgs/gone\.png does not exist"):
        load_folder_dataset({"root": "", "csv": "list.csv", "image_size": 8, "channels": 3}, tmp_path)


def test_folder_dataset_prepares_through_the_registry(tmp_path):
    from noisydml.tools.check import validate_all as validate_params
    from noisydml.data.registry import prepare_dataset
    import yaml

    _tree(tmp_path / "imgs", classes=6, per_class=3)
    raw = yaml.safe_load(open("params.yaml"))
    raw["datasets"]["mine"] = {"kind": "folder", "root": "imgs", "image_size": 12, "channels": 3}
    raw["grid"]["datasets"] = ["mine"]
    raw["chains"] = {}
    raw["figures"]["bspml_maps"] = {}
    raw["timing"]["dataset"] = "mine"
    raw["train"]["batch"] = {"classes": 3, "per_class": 2}
    cfg = validate_params(raw)["datasets"]["mine"]
    info = prepare_dataset("mine", cfg, tmp_path / "prepared", base_dir=tmp_path)
    ds = PreparedDataset.load(tmp_path / "prepared")
    assert info["num_classes"] == 6 and info["image_shape"] == [12, 12, 3]
    assert set(ds.split("train")["class_name"]) == {"class0", "class1", "class2"}
    assert set(ds.split("test")["class_name"]) == {"class3", "class4", "class5"}
    # the images are the files' pixels: class c, image i was filled with 10*c + i
    assert ds.images[ds.manifest.index[ds.manifest["class_name"] == "class4"][1]].max() == 41


def test_atomic_outputs_have_normal_permissions(tmp_path):
    """mkstemp/mkdtemp make 0600 files and 0700 folders; outputs must be readable by a group (umask 022)."""
    import os
    import stat

    from noisydml import io

    old = os.umask(0o022)
    try:
        io.write_json(tmp_path / "a.json", {"x": 1})
        with io.atomic_dir(tmp_path / "out") as tmp:
            (tmp / "f.txt").write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755


def test_the_next_writer_removes_what_a_killed_writer_left_and_only_that(tmp_path):
    """A writer killed mid-write leaves ``.<name>.<8 random>.tmp`` (or ``.<name>.old``) beside its destination;
    the next atomic write of that destination removes them, and no one else's."""
    import tempfile

    from noisydml import io

    folder_leftover = Path(tempfile.mkdtemp(prefix=".out.", suffix=".tmp", dir=tmp_path))  # as atomic_dir names it
    (folder_leftover / "model.pt").write_bytes(b"half")
    (tmp_path / ".out.old").mkdir()
    fd, file_leftover = tempfile.mkstemp(prefix=".a.json.", suffix=".tmp", dir=tmp_path)
    os.close(fd)
    fd, others = tempfile.mkstemp(prefix=".out.b.", suffix=".tmp", dir=tmp_path)  # the file out.b's, not out's
    os.close(fd)
    with io.atomic_dir(tmp_path / "out") as tmp:
        (tmp / "f.txt").write_text("x")
    io.write_json(tmp_path / "a.json", {"x": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a.json", "out", Path(others).name])
    assert not Path(file_leftover).exists() and not folder_leftover.exists()
