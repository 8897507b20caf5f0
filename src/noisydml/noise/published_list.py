"""The authors' published noisy label lists as a noise kind (``published_list``).

PRISM's authors (Liu et al., CVPR 2021) published the exact noisy training lists of their Tables 1-2 for CUB,
Cars196 and SOP (``datalist/`` of alibaba-edu/Ranking-based-Instance-Selection, MIT; a copy is in
``references/prism-datalist/``); SGPS's tables use the same settings. Each setting is two lists:

- the noisy list ``{DS}_{rate}{noised,smallclusternoised}_train.csv``: every training image, one line
  ``/data/<dataset folder>/<relative path>,<label>``;
- the kept list ``..._cleaned_train.csv``: the images that kept their true label.

A sample is noisy when it is absent from the kept list, not when its label id changed: the small-cluster lists
renumber every label into a merged label space (PRISM Sec. 4.1's "small-cluster" noise), so ids are not
comparable with the clean split's.

The authors' label ids are mapped onto our class ids (the true labels ``0..C-1``):

1. by the kept samples: a kept sample's label names its true class (checked: one class per label, one label
   per class);
2. a label no kept sample carries (SOP's symmetric lists: a class whose every image was flipped away, while other
   images were flipped into its id) is mapped through the authors' clean list ``{DS}_train.csv`` (optional
   ``clean_list``), whose ids are the original label space of the symmetric lists;
3. a label still unmapped names no training class and stays a class of its own after ours, as the authors' list
   has it: the CUB 0.2 and 0.5 symmetric lists give 6 and 28 images label 101, a test-class id. The statistics
   count them (``outside_training_classes``) and the noise table says so.

Lists are matched to the prepared manifest by the image path relative to the dataset's files tree: the list's
paths minus ``strip_prefix`` (``/data/`` for CUB and SOP, whose folders we keep as the archives have them).
Every list is read from a path or an http(s) URL (gzip read transparently) and verified against its pinned
sha256 (of the uncompressed text, so one value serves the upstream file and our gzip copy); the pinned sums
in params make the content part of the corrupt stage's params, so no hidden read can change the labels.
"""

from __future__ import annotations

import gzip
import hashlib
import io as _io
import tempfile
import urllib.parse
from pathlib import Path, PurePosixPath

import numpy as np
import pandas as pd

from noisydml.data.download import Archive, DownloadError, fetch_archive
from noisydml.noise.small_cluster import NoiseInputError
from noisydml.schema import Field, ParamsError, check_section, check_sha256

LIST_SCHEMA = {
    "source": Field(str, help="path (relative to the repository) or http(s) URL of the list; .gz is read as gzip"),
    "sha256": Field(str, help="sha256 of the list's uncompressed text"),
}

#: How many unmatched paths an error quotes.
SHOWN = 5


def check_list_spec(raw, where: str, required: bool = True) -> dict | None:
    if raw is None and not required:
        return None
    if not isinstance(raw, dict):
        raise ParamsError(f"{where}: {raw!r} is not a mapping; expected {{source: path-or-URL, sha256: hex}}")
    spec = check_section(raw, LIST_SCHEMA, where)
    spec["sha256"] = check_sha256(spec["sha256"], f"{where}.sha256")
    return spec


def read_list_bytes(source: str, timeout: float = 60.0) -> bytes:
    """The list's text: read from a path, or fetched from an http(s) URL by the benchmarks' downloader (retries,
    a resumed transfer) into a temporary folder; the sha256 pinned is that of the uncompressed text, checked by
    the caller, so the download itself is not pinned."""
    if source.startswith(("http://", "https://")):
        name = PurePosixPath(urllib.parse.urlparse(source).path).name or "list"
        with tempfile.TemporaryDirectory(prefix="noisydml-list-") as folder:
            try:
                path, _, _ = fetch_archive(Archive(name, url=source), Path(folder), timeout=timeout, progress=False)
            except DownloadError as error:
                raise NoiseInputError(f"{source}: cannot fetch the label list ({str(error).splitlines()[0]}); "
                                      "download it by hand and give its path as source (the sha256 stays the "
                                      "same)") from error
            data = path.read_bytes()
    else:
        path = Path(source)
        if not path.is_file():
            raise NoiseInputError(f"{source}: label list not found")
        data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def read_label_list(spec: dict, what: str) -> pd.DataFrame:
    """``path, label`` rows of a list, after checking its sha256; the label follows the last comma."""
    text = read_list_bytes(spec["source"])
    sha = hashlib.sha256(text).hexdigest()
    if sha != spec["sha256"]:
        raise NoiseInputError(f"{what} {spec['source']}: sha256 {sha}, expected {spec['sha256']} (a different "
                              "file or version; pin the sum of the list you mean)")
    table = pd.read_csv(_io.BytesIO(text), header=None, names=["path", "label"], sep=r",(?=[^,]*$)",
                        engine="python", dtype={"path": str, "label": np.int64}, keep_default_na=False)
    duplicated = table["path"][table["path"].duplicated()]
    if len(duplicated):
        raise NoiseInputError(f"{what} {spec['source']}: {len(duplicated)} path(s) listed twice, e.g. "
                              f"{duplicated.iloc[0]!r}")
    return table


def _relative(table: pd.DataFrame, prefix: str, what: str) -> pd.Series:
    outside = ~table["path"].str.startswith(prefix)
    if outside.any():
        raise NoiseInputError(f"{what}: {int(outside.sum())} path(s) do not start with strip_prefix {prefix!r}, "
                              f"e.g. {table['path'][outside].iloc[0]!r}")
    return table["path"].str.slice(len(prefix))


def _positions(list_paths: pd.Series, index: pd.Series, what: str) -> np.ndarray:
    """Row of each list path in the training set; unmatched paths are an error naming the first few."""
    positions = list_paths.map(index)
    unmatched = list_paths[positions.isna()]
    if len(unmatched):
        shown = ", ".join(repr(p) for p in unmatched.iloc[:SHOWN])
        raise NoiseInputError(f"{what}: {len(unmatched)} of {len(list_paths)} paths match no training image of the "
                              f"prepared dataset (paths after strip_prefix, relative to its files tree), e.g. {shown}")
    return positions.to_numpy(dtype=np.int64)


def published_list_labels(paths: np.ndarray, true_labels: np.ndarray, cfg: dict, read=read_label_list):
    """``(labels, is_noisy, stats)`` of a training set from the authors' lists (see the module docstring).

    ``cfg``: one dataset's entry of the setting's ``lists`` (``noisy_list, kept_list, clean_list,
    strip_prefix``); ``paths``: each training sample's path relative to the files tree; ``true_labels``:
    ``0..C-1``. Returned labels are our class ids for the authors' labels that name a training class,
    ``C, C+1, ...`` (in the authors' id order) for those that name none."""
    prefix = cfg["strip_prefix"]
    num_classes = int(true_labels.max()) + 1
    index = pd.Series(np.arange(len(paths)), index=pd.Index(paths))

    noisy_list = read(cfg["noisy_list"], "noisy_list")
    at = _positions(_relative(noisy_list, prefix, "noisy_list"), index, "noisy_list")
    if len(at) != len(paths):
        listed = np.zeros(len(paths), bool)
        listed[at] = True
        missing = [repr(p) for p in np.asarray(paths)[~listed][:SHOWN]]
        raise NoiseInputError(f"noisy_list: lists {len(at)} images, the training split has {len(paths)}; not listed: "
                              f"{', '.join(missing)}")
    authors = np.empty(len(paths), np.int64)
    authors[at] = noisy_list["label"].to_numpy()

    kept_list = read(cfg["kept_list"], "kept_list")
    kept_at = _positions(_relative(kept_list, prefix, "kept_list"), index, "kept_list")
    relabelled = kept_list["label"].to_numpy() != authors[kept_at]
    if relabelled.any():
        raise NoiseInputError(f"kept_list: {int(relabelled.sum())} image(s) carry another label than in noisy_list, "
                              f"e.g. {kept_list['path'][relabelled].iloc[0]!r}; the lists are not a pair")
    is_noisy = np.ones(len(paths), bool)
    is_noisy[kept_at] = False

    # 1. the kept samples: a kept sample's label names its true class
    label_to_class: dict[int, int] = {}
    pairs = pd.DataFrame({"author": authors[kept_at], "true": true_labels[kept_at]}).drop_duplicates()
    for column, other in (("author", "class"), ("true", "label")):
        clash = pairs[pairs[column].duplicated(keep=False)]
        if len(clash):
            raise NoiseInputError(f"kept_list: kept images of {column} {int(clash[column].iloc[0])} carry more than one "
                                  f"{other}; kept images must keep their true label")
    label_to_class.update(zip(pairs["author"].tolist(), pairs["true"].tolist()))
    by_kept = len(label_to_class)

    # 2. labels no kept sample carries: the authors' clean list (their original label space)
    by_clean = 0
    unmapped = sorted(set(np.unique(authors).tolist()) - set(label_to_class))
    if unmapped and cfg["clean_list"] is not None:
        clean = read(cfg["clean_list"], "clean_list")
        clean_at = _positions(_relative(clean, prefix, "clean_list"), index, "clean_list")
        original = dict(zip(clean["label"].tolist(), true_labels[clean_at].tolist()))
        taken = set(label_to_class.values())
        for label in unmapped:
            cls = original.get(label)
            if cls is not None and cls not in taken:
                label_to_class[label] = cls
                taken.add(cls)
                by_clean += 1

    # 3. the rest name no training class: classes of their own, after ours
    outside = sorted(set(np.unique(authors).tolist()) - set(label_to_class))
    for offset, label in enumerate(outside):
        label_to_class[label] = num_classes + offset
    lookup = pd.Series(label_to_class)
    labels = lookup.loc[authors].to_numpy(dtype=np.int64)
    counts = pd.Series(authors).value_counts()
    stats = {
        "noisy_list": {**cfg["noisy_list"], "lines": int(len(noisy_list))},
        "kept_list": {**cfg["kept_list"], "lines": int(len(kept_list))},
        "clean_list": cfg["clean_list"],
        "strip_prefix": prefix,
        "authors_label_count": int(len(counts)),
        "label_map": {"by_kept_samples": by_kept, "by_clean_list": by_clean, "outside_training_classes": len(outside)},
        # the authors' labels that name no training class, with their image counts (kept as classes of their own)
        "outside_training_classes": {str(label): int(counts[label]) for label in outside},
        "num_training_labels": int(len(counts)),
        "note": "is_noisy = absent from kept_list (the authors' record), not a changed label id",
    }
    return labels, is_noisy, stats


DATASET_LISTS_SCHEMA = {
    "noisy_list": Field(dict, help="{source, sha256}: every training image with its noisy label"),
    "kept_list": Field(dict, help="{source, sha256}: the images that kept their true label"),
    "clean_list": Field((dict, type(None)), None,
                        help="{source, sha256}: the authors' clean list, mapping labels no kept image carries"),
    "strip_prefix": Field(str, help="removed from the lists' paths to give paths relative to the files tree"),
}


def check_published_list(cfg: dict, raw: dict, where: str) -> dict:
    """The lists of a ``published_list`` setting, each checked (``raw``, the section as written, is not needed:
    the signature is the noise kinds' ``extra_check``)."""
    if not cfg["lists"]:
        raise ParamsError(f"{where}.lists: empty; give one entry per dataset: "
                          "{<dataset>: {noisy_list, kept_list, clean_list, strip_prefix}}")
    checked = {}
    for dataset, entry in cfg["lists"].items():
        at = f"{where}.lists.{dataset}"
        entry = check_section(entry, DATASET_LISTS_SCHEMA, at)
        entry["noisy_list"] = check_list_spec(entry["noisy_list"], f"{at}.noisy_list")
        entry["kept_list"] = check_list_spec(entry["kept_list"], f"{at}.kept_list")
        entry["clean_list"] = check_list_spec(entry["clean_list"], f"{at}.clean_list", required=False)
        checked[dataset] = entry
    cfg["lists"] = checked
    return cfg


def lists_for(cfg: dict, dataset: str | None, where: str = "published_list noise") -> dict:
    """The setting's entry for ``dataset``, or an error naming the datasets it has lists for."""
    if dataset not in cfg["lists"]:
        raise NoiseInputError(f"{where}: no lists for dataset {dataset!r}; lists has: {', '.join(cfg['lists'])} "
                              "(the authors published lists for CUB, Cars196 and SOP)")
    return cfg["lists"][dataset]
