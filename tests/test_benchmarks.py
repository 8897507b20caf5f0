"""The eight benchmarks: for each, a tiny archive (or URL list) in the dataset's real layout, served on 127.0.0.1,
downloaded, verified, extracted and prepared by the stages, with the official split and the count check (scaled
to the fixture through ``expect``)."""

import io
import tarfile

import numpy as np
import pandas as pd
import pytest

from conftest import benchmark_params, jpeg_bytes, serve_archives, tar_bytes, zip_bytes
from noisydml.data import DatasetError
from noisydml.data.benchmarks import BENCHMARKS
from noisydml.data.download import DownloadError
from noisydml.data.prepared import PreparedDataset
from noisydml.tools.check import validate_all
from noisydml.pipeline.download import download
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.prepare import prepare


def _run(params, name, tmp_path):
    layout = Layout(tmp_path)
    record = download(params, name, layout)
    info = prepare(params, name, layout)
    return record, info, PreparedDataset.load(layout.prepared(name), base_dir=tmp_path)


def _counts(ds):
    return {s: (int((ds.manifest["split"] == s).sum()), int(ds.manifest.loc[ds.manifest["split"] == s, "label"]
                                                            .nunique())) for s in sorted(set(ds.manifest["split"]))}


def test_cub200(tmp_path, raw_params, local_server):
    classes = {1: "001.Black_footed_Albatross", 2: "002.Laysan_Albatross", 101: "101.White_Pelican",
               102: "102.Western_Wood_Pewee"}
    members, images, labels, n = {}, [], [], 0
    for cid, cname in classes.items():
        for i in range(3):
            n += 1
            rel = f"{cname}/{cname[4:]}_{i:04d}.jpg"
            members[f"CUB_200_2011/images/{rel}"] = jpeg_bytes(n)
            images.append(f"{n} {rel}")
            labels.append(f"{n} {cid}")
    members["CUB_200_2011/images.txt"] = ("\n".join(images) + "\n").encode()
    members["CUB_200_2011/image_class_labels.txt"] = ("\n".join(labels) + "\n").encode()
    members["CUB_200_2011/classes.txt"] = "".join(f"{c} {n}\n" for c, n in classes.items()).encode()
    archives = serve_archives(local_server, {"CUB_200_2011.tgz": tar_bytes(members)})
    expect = {"train_samples": 6, "test_samples": 6, "train_classes": 2, "test_classes": 2}
    params = benchmark_params(raw_params, "cub", {"kind": "cub200", "archives": archives, "expect": expect})
    record, info, ds = _run(params, "cub", tmp_path)
    assert record["archives"][0]["verified"] and info["storage"] == "files"
    assert _counts(ds) == {"test": (6, 2), "train": (6, 2)}
    assert set(ds.split("train")["class_name"]) == {"1", "2"}
    first = ds.manifest.iloc[0]
    assert (tmp_path / ds.info["images_root"] / first["path"]).is_file() and first["width"] == 20
    # the official counts are checked: the unscaled check stops, naming both figures
    params = benchmark_params(raw_params, "cub", {"kind": "cub200", "archives": archives})
    with pytest.raises(DatasetError, match="train samples: the official count is 5,864, the files give 6"):
        prepare(params, "cub", Layout(tmp_path))
    # a re-run of the download stage fetches nothing
    _, served = local_server
    before = len(served.log)
    download(benchmark_params(raw_params, "cub", {"kind": "cub200", "archives": archives, "expect": expect}), "cub",
             Layout(tmp_path))
    assert len(served.log) == before


def _cars_annos(rows: list[tuple[str, int]]) -> bytes:
    from scipy.io import savemat

    annotations = np.zeros((1, len(rows)), dtype=[("relative_im_path", "O"), ("class", "O"), ("test", "O")])
    for i, (path, cls) in enumerate(rows):
        annotations[0, i] = (path, np.array([[cls]], np.uint8), np.array([[0]], np.uint8))
    buf = io.BytesIO()
    savemat(buf, {"annotations": annotations, "class_names": np.array(["a", "b"], dtype=object)})
    return buf.getvalue()


def _cars196_files(classes=(1, 2, 99, 100), per_class=2) -> dict[str, bytes]:
    members, rows = {}, []
    for cls in classes:
        for i in range(per_class):
            path = f"car_ims/{len(rows) + 1:06d}.jpg"
            members[path] = jpeg_bytes(1000 + len(rows))
            rows.append((path, cls))
    return {"car_ims.tgz": tar_bytes(members), "cars_annos.mat": _cars_annos(rows)}


def test_cars196(tmp_path, raw_params, local_server):
    archives = serve_archives(local_server, _cars196_files())
    expect = {"train_samples": 4, "test_samples": 4, "train_classes": 2, "test_classes": 2}
    params = benchmark_params(raw_params, "cars", {"kind": "cars196", "archives": archives, "expect": expect})
    record, _, ds = _run(params, "cars", tmp_path)
    assert _counts(ds) == {"test": (4, 2), "train": (4, 2)}
    assert set(ds.split("test")["class_name"]) == {"99", "100"}
    assert all(a["verified"] for a in record["archives"])  # checksums given by the test


def test_sop_numeric_labels_follow_the_official_lists(tmp_path, raw_params, local_server):
    # classes 1, 2 and 10 train, 3 and 11 test: neither text order nor "first half" gives this split
    split = {1: "train", 2: "train", 10: "train", 3: "test", 11: "test"}
    members, lists, image_id = {}, {"train": [], "test": []}, 0
    for cls, part in split.items():
        for i in range(2):
            image_id += 1
            rel = f"bicycle_final/{cls}_{i}.JPG"
            members[f"Stanford_Online_Products/{rel}"] = jpeg_bytes(image_id)
            lists[part].append(f"{image_id} {cls} 1 {rel}")
    for part, name in (("train", "Ebay_train.txt"), ("test", "Ebay_test.txt")):
        members[f"Stanford_Online_Products/{name}"] = ("image_id class_id super_class_id path\n"
                                                        + "\n".join(lists[part]) + "\n").encode()
    archives = serve_archives(local_server, {"Stanford_Online_Products.zip": zip_bytes(members)})
    expect = {"train_samples": 6, "test_samples": 4, "train_classes": 3, "test_classes": 2}
    params = benchmark_params(raw_params, "sop", {"kind": "sop", "archives": archives, "expect": expect})
    _, _, ds = _run(params, "sop", tmp_path)
    assert set(ds.split("train")["class_name"]) == {"1", "2", "10"}
    order = ds.manifest.groupby("class_name")["label"].first()
    assert list(order.sort_values().index) == ["1", "2", "3", "10", "11"]  # numerically, not as text


def test_inshop_query_gallery_from_its_partition_list_given_by_hand(tmp_path, raw_params):
    members, lines = {}, []
    for item in range(1, 5):
        for i, status in enumerate(["train", "train"] if item <= 2 else ["query", "gallery", "gallery"]):
            rel = f"img/WOMEN/Dresses/id_{item:08d}/0{i}_1_front.jpg"
            members[rel] = jpeg_bytes(item * 10 + i)
            lines.append(f"{rel} id_{item:08d} {status}")
    downloads = tmp_path / "data/raw/shop/downloads"
    downloads.mkdir(parents=True)
    (downloads / "img.zip").write_bytes(zip_bytes(members))  # given out by the owners: put in place by hand
    (downloads / "list_eval_partition.txt").write_text(f"{len(lines)}\nimage_name item_id evaluation_status\n"
                                                       + "\n".join(lines) + "\n")
    expect = {"train_samples": 4, "query_samples": 2, "gallery_samples": 4, "train_classes": 2,
              "query_classes": 2, "gallery_classes": 2}
    params = benchmark_params(raw_params, "shop", {"kind": "inshop", "expect": expect})
    record, info, ds = _run(params, "shop", tmp_path)
    assert _counts(ds) == {"gallery": (4, 2), "query": (2, 2), "train": (4, 2)}
    assert not any(a["verified"] for a in record["archives"])  # nothing pinned: recorded, and said so
    assert len(record["archives"][0]["sha256"]) == 64


def test_an_owner_only_dataset_without_its_files_says_where_to_put_them(tmp_path, raw_params):
    params = benchmark_params(raw_params, "shop", {"kind": "inshop"})
    with pytest.raises(DownloadError) as e:
        download(params, "shop", Layout(tmp_path))
    assert "on request from the DeepFashion authors" in str(e.value)
    assert str((tmp_path / "data/raw/shop/downloads/img.zip").resolve()) in str(e.value)


def test_food101n_first_50_classes_train_with_verification_flags(tmp_path, raw_params, local_server):
    # Food-101N's classes.txt is not in Python's sorted() order (cheesecake before cheese_plate): file order counts
    names = [f"dish_{i:02d}" for i in range(10)] + ["cheesecake", "cheese_plate"] + [f"dish_{i:02d}" for i in
                                                                                    range(12, 52)]
    noisy = {"Food-101N_release/meta/classes.txt": ("class_name\n" + "\n".join(names) + "\n").encode()}
    keys, verified = [], []
    for c, name in enumerate(names):
        for i in range(2):
            key = f"{name}/{c}_{i}.jpg"
            noisy[f"Food-101N_release/images/{key}"] = jpeg_bytes(c * 10 + i)
            keys.append(key)
            if c < 3:
                verified.append(f"{key}\t{int(i == 0)}")
    noisy["Food-101N_release/meta/imagelist.tsv"] = ("class_name/key\n" + "\n".join(keys) + "\n").encode()
    noisy["Food-101N_release/meta/verified_train.tsv"] = ("class_name/key\tverification_label\n"
                                                          + "\n".join(verified[:4]) + "\n").encode()
    noisy["Food-101N_release/meta/verified_val.tsv"] = ("class_name/key\tverification_label\n"
                                                        + "\n".join(verified[4:]) + "\n").encode()
    food = {"food-101/meta/classes.txt": ("\n".join(sorted(names)) + "\n").encode()}
    train_txt, test_txt = [], []
    for name in names:
        for i in range(3):
            key = f"{name}/{i}"
            food[f"food-101/images/{key}.jpg"] = jpeg_bytes(500 + i)
            (test_txt if i == 0 else train_txt).append(key)
    food["food-101/meta/train.txt"] = ("\n".join(train_txt) + "\n").encode()
    food["food-101/meta/test.txt"] = ("\n".join(test_txt) + "\n").encode()
    archives = serve_archives(local_server, {"Food-101N_release.zip": zip_bytes(noisy), "food-101.tar.gz": tar_bytes(food)})
    expect = {"train_samples": 100, "test_samples": 6, "test_classes": 2}
    params = benchmark_params(raw_params, "food", {"kind": "food101n", "archives": archives, "expect": expect})
    _, info, ds = _run(params, "food", tmp_path)
    assert _counts(ds) == {"test": (6, 2), "train": (100, 50)}
    assert set(ds.split("test")["class_name"]) == {"dish_50", "dish_51"}
    flags = ds.split("train")["is_clean"]
    assert flags.notna().sum() == 6 and flags.sum() == 3  # verified flags kept; unverified stay unknown
    # Food-101's own test split only
    params = benchmark_params(raw_params, "food", {"kind": "food101n", "archives": archives, "test_images": "test",
                                          "expect": {**expect, "test_samples": 2}})
    assert prepare(params, "food", Layout(tmp_path))["num_test_samples"] == 2
    # Food-101N's classes must be Food-101's
    food["food-101/meta/classes.txt"] = ("\n".join(sorted(names[:-1] + ["pho"])) + "\n").encode()
    archives = serve_archives(local_server, {"Food-101N_release.zip": zip_bytes(noisy), "food-101.tar.gz": tar_bytes(food)})
    params = benchmark_params(raw_params, "food", {"kind": "food101n", "archives": archives, "expect": expect})
    with pytest.raises(DatasetError, match="its classes are not Food-101's.*first difference: 'dish_51'"):
        _run(params, "food", tmp_path / "other")


def test_food101n_official_counts_follow_test_images():
    bench = BENCHMARKS["food101n"]
    assert bench.official_counts({"test_images": "all", "expect": {}})["test_samples"] == 51000
    assert bench.official_counts({"test_images": "test", "expect": {}})["test_samples"] == 12750  # 51 x 250
    assert bench.official_counts({"test_images": "test", "expect": {"test_samples": 7}})["test_samples"] == 7


def test_cars98n_fetches_its_url_list_and_records_dead_links(tmp_path, raw_params, local_server):
    base, served = local_server
    rows = []
    for label in range(2):
        for i in range(3):
            name = f"{label}_{i}.jpg"
            served.files[f"/web/{name}"] = jpeg_bytes(label * 10 + i)
            rows.append(f"{base}/web/{name},{label}")
    rows.append(f"{base}/web/dead.jpg,0")
    served.files["/web/page.jpg"] = b"<html>gone</html>"
    rows.append(f"{base}/web/page.jpg,1")
    rows.append(f"{base}/web/0_0.jpg,1")  # the same image name under another class is kept apart
    lst = ("\n".join(rows) + "\n").encode()
    archives = serve_archives(local_server, {"CARS_98N_list.csv": lst, **_cars196_files()})
    expect = {"train_samples": 7, "train_classes": 2, "test_samples": 4, "test_classes": 2}
    params = benchmark_params(raw_params, "carsn", {"kind": "cars98n", "archives": archives, "expect": expect,
                                           "retries": 0, "fetch_workers": 2})
    record, _, ds = _run(params, "carsn", tmp_path)
    assert record["fetched"] == {"listed": 9, "available": 7, "ok": 7, "dead": 1, "not_image": 1}
    fetched = pd.read_csv(tmp_path / "data/raw/carsn/files/fetched.csv")
    assert fetched.loc[fetched["url"].str.endswith("dead.jpg"), "status"].item() == "dead"
    assert _counts(ds) == {"test": (4, 2), "train": (7, 2)}
    assert set(ds.split("train")["class_name"]) == {"1", "2"}  # the list's 0..97 are Cars196's ids 1..98


def test_cars98n_with_dead_links_stops_unless_the_subset_is_said():
    """CARS-98N's images come from the web: fewer than the paper's 9,558 is an error naming the count found, and
    datasets.<name>.expect says a subset is meant."""
    from noisydml.data.benchmarks import check_counts

    items = pd.DataFrame({"split": ["train"] * 5 + ["test"] * 2, "class_name": list("aabbbcd")})
    bench = BENCHMARKS["cars98n"]
    assert bench.min_counts == {"train_samples": 9558}
    with pytest.raises(DatasetError, match=r"carsn: train samples: 5 found, the paper's data has 9,558.*"
                                           r"expect: \{train_samples: 5\}"):
        check_counts("carsn", items, {"test_samples": 2}, at_least=bench.min_counts)
    assert check_counts("carsn", items, {"test_samples": 2, "train_samples": 5},
                        at_least=bench.min_counts)["train_samples"] == 5


def test_clothing1m_shares_its_classes_and_keeps_verified_flags(tmp_path, raw_params):
    downloads = tmp_path / "data/raw/cloth/downloads"
    downloads.mkdir(parents=True)
    noisy_kv, clean_kv, train_keys, test_keys = [], [], [], []
    for part in range(10):
        members = {}
        for i in range(2 if part < 2 else 0):
            key = f"images/{part}/{i:02d}/{part}{i}.jpg"
            members[key] = jpeg_bytes(part * 10 + i)
            if part == 0:
                train_keys.append(key)
                noisy_kv.append(f"{key} {i}")
                if i == 0:
                    clean_kv.append(f"{key} 1")  # verified: the noisy label 0 is wrong
            else:
                test_keys.append(key)
                clean_kv.append(f"{key} {i}")
        members.setdefault(f"images/{part}/.keep", b"")
        (downloads / f"{part}.tar").write_bytes(tar_bytes(members, gz=False))
    ann = {"annotations/noisy_label_kv.txt": "\n".join(noisy_kv) + "\n",
           "annotations/clean_label_kv.txt": "\n".join(clean_kv) + "\n",
           "annotations/noisy_train_key_list.txt": "\n".join(train_keys) + "\n",
           "annotations/clean_test_key_list.txt": "\n".join(test_keys) + "\n"}
    (downloads / "annotations.zip").write_bytes(zip_bytes({k: v.encode() for k, v in ann.items()}))
    expect = {"train_samples": 2, "test_samples": 2, "train_classes": 2, "test_classes": 2}
    params = benchmark_params(raw_params, "cloth", {"kind": "clothing1m", "expect": expect})
    _, _, ds = _run(params, "cloth", tmp_path)
    assert _counts(ds) == {"test": (2, 2), "train": (2, 2)}  # the same 2 classes on both sides
    train = ds.split("train")
    assert train["is_clean"].iloc[0] == 0 and pd.isna(train["is_clean"].iloc[1])


def test_local_dir_reads_an_extracted_copy_without_downloading(tmp_path, raw_params):
    root = tmp_path / "my_cars"
    files = _cars196_files()
    with tarfile.open(fileobj=io.BytesIO(files["car_ims.tgz"])) as tf:
        tf.extractall(root, filter="data")
    (root / "cars_annos.mat").write_bytes(files["cars_annos.mat"])
    expect = {"train_samples": 4, "test_samples": 4, "train_classes": 2, "test_classes": 2}
    params = benchmark_params(raw_params, "cars", {"kind": "cars196", "local_dir": str(root), "expect": expect})
    record, _, ds = _run(params, "cars", tmp_path)
    assert "nothing downloaded" in record["note"] and len(ds.manifest) == 8


def _cnwl_release(base: str, served) -> bytes:
    """Google's dataset_no_images.zip in miniature: the Stanford Cars annotations and split files (and a
    mini-ImageNet half whose files share the names), web images served at their URLs."""
    import json

    web = {"w1": (0, False), "w2": (1, False), "w3": (1, True), "w4": (0, False), "dead": (0, False)}
    for i, name in enumerate(web):
        if name != "dead":
            served.files[f"/web/{name}.jpg"] = jpeg_bytes(200 + i)
    annotations = {"data": [[{"image/id": name, "image/uri": f"{base}/web/{name}.jpg", "image/class/label": label,
                              "image/class/label/is_clean": clean}] for name, (label, clean) in web.items()]}
    # w3 was also annotated under label 0, as wrong there: its verdict under label 1 is the one that counts
    annotations["data"].insert(0, [{"image/id": "w3", "image/uri": f"{base}/web/w3.jpg", "image/class/label": 0,
                                    "image/class/label/is_clean": False}])
    # labels 0, 1 train; 98, 99 test. Level 0.4: own images + web images w1 (wrong), w2 (wrong), w3 (annotated
    # right), w4 (annotated under label 0, listed under 1: unknown), dead (never fetched)
    level = ["000001.jpg 0", "000002.jpg 0", "000003.jpg 1", "w1.jpg 0", "w2.jpg 1", "w3.jpg 1", "w4.jpg 1",
             "dead.jpg 0", "000005.jpg 98"]
    clean = ["000001.jpg 0", "000002.jpg 0", "000003.jpg 1", "000004.jpg 1", "000005.jpg 98", "000006.jpg 99"]
    validation = ["000007.jpg 98", "000008.jpg 99", "000009.jpg 0"]
    lines = lambda rows: ("\n".join(rows) + "\n").encode()
    return zip_bytes({
        "dataset_no_images/stanford-cars-annotations.json": json.dumps(annotations).encode(),
        "dataset_no_images/stanford_cars/split/red_noise_nl_0.4": lines(level),
        "dataset_no_images/stanford_cars/split/red_noise_nl_0.0": lines(clean),
        "dataset_no_images/stanford_cars/split/clean_validation": lines(validation),
        "dataset_no_images/mini-imagenet/split/red_noise_nl_0.4": lines(["n01.jpg 3"]),
        "dataset_no_images/mini-imagenet/split/red_noise_nl_0.0": lines(["n01.jpg 3"]),
        "dataset_no_images/mini-imagenet/split/clean_validation": lines(["n02.jpg 3"]),
        "dataset_no_images/mini-imagenet-annotations.json": json.dumps({"data": []}).encode(),
    })


def test_cnwl_red_cars_keeps_the_annotators_verdict_per_web_image(tmp_path, raw_params, local_server):
    """CNWL Red Stanford Cars: the release's split file of the chosen level trains (labels 0..97), web images are
    fetched from their URLs (a dead one recorded and left out), each training row carries the truth (Stanford
    Cars' own images right, a web image as its annotators judged it under that label, unknown under another), and
    the clean images of labels 98..195 test; the mini-ImageNet half's same-named files are not read."""
    base, served = local_server
    car_ims = {f"car_ims/{i:06d}.jpg": jpeg_bytes(100 + i) for i in range(1, 10)}
    archives = serve_archives(local_server, {"dataset_no_images.zip": _cnwl_release(base, served),
                                             "car_ims.tgz": tar_bytes(car_ims)})
    cfg = {"kind": "cnwl_cars", "archives": archives, "retries": 0, "fetch_workers": 2,
           "expect": {"train_classes": 2, "test_classes": 2}}
    record, info, ds = _run(benchmark_params(raw_params, "cnwl", cfg), "cnwl", tmp_path)
    assert record["fetched"] == {"listed": 5, "available": 4, "ok": 4, "dead": 1}
    assert _counts(ds) == {"test": (4, 2), "train": (7, 2)}
    train = ds.split("train").set_index(ds.split("train")["path"].str.split("/").str[-1])
    assert train["is_clean"].to_dict() == pytest.approx(
        {"000001.jpg": 1.0, "000002.jpg": 1.0, "000003.jpg": 1.0, "w1.jpg": 0.0, "w2.jpg": 0.0, "w3.jpg": 1.0,
         "w4.jpg": np.nan}, nan_ok=True)
    assert sorted(ds.split("test")["path"].str.split("/").str[-1]) == ["000005.jpg", "000006.jpg", "000007.jpg",
                                                                      "000008.jpg"]
    assert info["noise_level"] == 0.4
    # another level is another split file; one the release lacks is named
    with pytest.raises(DatasetError, match=r"0 files named 'red_noise_nl_0.8' outside mini-imagenet/"):
        prepare(benchmark_params(raw_params, "cnwl", {**cfg, "noise_level": 0.8}), "cnwl", Layout(tmp_path))
    # Stanford Cars' own images looked for in the wrong folder: the error names the key and the first names
    with pytest.raises(DatasetError, match=r"CNWL: 7 of Stanford Cars' own images .*\(first: cars_train/000001.jpg"):
        prepare(benchmark_params(raw_params, "cnwl", {**cfg, "original_images": "cars_train"}), "cnwl",
                Layout(tmp_path))


def test_cnwl_params_name_the_level_and_the_folder(raw_params):
    from noisydml.schema import ParamsError

    with pytest.raises(ParamsError, match=r"datasets.cnwl.noise_level: 0.7 is not allowed; allowed values: 0.0, "
                                          r"0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8"):
        benchmark_params(raw_params, "cnwl", {"kind": "cnwl_cars", "noise_level": 0.7})
    with pytest.raises(ParamsError, match=r"datasets.cnwl.original_images: '../cars'; allowed: a folder inside"):
        benchmark_params(raw_params, "cnwl", {"kind": "cnwl_cars", "original_images": "../cars"})


def test_params_name_the_wrong_key(raw_params):
    from noisydml.schema import ParamsError

    with pytest.raises(ParamsError, match=r"datasets.cub.expect: 'train_images' is not a count; allowed: "):
        benchmark_params(raw_params, "cub", {"kind": "cub200", "expect": {"train_images": 3}})
    with pytest.raises(ParamsError, match=r"datasets.cub.archives: 'cub.tgz' is not one of cub200's files"):
        benchmark_params(raw_params, "cub", {"kind": "cub200", "archives": {"cub.tgz": {"url": "x"}}})


def test_the_embedded_dataset_downloads_nothing(tmp_path, raw_params):
    params = validate_all(raw_params)
    record = download(params, "glyphs", Layout(tmp_path))
    assert record == {"dataset": "glyphs", "kind": "glyphs", "note": "kind 'glyphs': nothing to download"}


def _items_with(counts: dict[str, int]) -> pd.DataFrame:
    """Rows with exactly ``counts`` (``<split>_samples`` / ``<split>_classes``), as a layout function returns them."""
    parts = []
    for split in ("train", "test", "query", "gallery"):
        samples = counts.get(f"{split}_samples", counts.get(f"{split}_classes", 0) * 3)
        classes = counts.get(f"{split}_classes", 0)
        if samples:
            group = "test" if split in ("query", "gallery") else split  # In-Shop's query and gallery share classes
            names = [f"{group}{i % max(classes, 1)}" for i in range(samples)]
            parts.append(pd.DataFrame({"path": [f"{split}/{i}.jpg" for i in range(samples)], "class_name": names,
                                       "split": split, "is_clean": np.nan}))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("kind", sorted(BENCHMARKS))
def test_each_benchmark_s_identity_is_checked_by_its_counts(kind):
    """Per benchmark: its official counts pass; one training image more or fewer, or one class fewer, is refused
    before anything is verified or trained, naming the figure the files give and the official one."""
    from noisydml.data.benchmarks import check_counts

    bench = BENCHMARKS[kind]
    cfg = {"expect": {}, "test_images": "all"}
    official = bench.official_counts(cfg)
    counts = {**official, **bench.min_counts}
    assert check_counts(kind, _items_with(counts), official, at_least=bench.min_counts)["train_classes"] == \
        counts["train_classes"]
    key = next((k for k in ("train_samples", "test_samples") if k in official), None)  # CNWL: classes only
    for changed in ([{key: counts[key] - 1}] if key else []) + [{"train_classes": counts["train_classes"] - 1}]:
        wrong = {**counts, **changed}
        what, value = next(iter(changed.items()))
        with pytest.raises(DatasetError, match=f"{what.replace('_', ' ')}: the official count is "
                                               f"{official[what]:,}, the files give {value:,}"):
            check_counts(kind, _items_with(wrong), official, at_least=bench.min_counts)
    for what, least in bench.min_counts.items():  # CARS-98N: images fetched from the web, fewer is refused
        with pytest.raises(DatasetError, match=f"{least - 1:,} found, the paper's data has {least:,}"):
            check_counts(kind, _items_with({**counts, what: least - 1}), official, at_least=bench.min_counts)
