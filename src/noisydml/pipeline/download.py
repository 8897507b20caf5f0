"""The download stage, one per dataset: a benchmark's archives -> ``data/raw/<dataset>``.

``data/raw/<dataset>/downloads`` holds the archives (resumable, sha256-checked), ``files`` the dataset's files
tree they are extracted into (or, for CARS-98N, the fetched images), and ``download.json`` what was done: each
archive's sha256 and whether it matched a pinned one, and the URL list's fetch counts. The embedded and folder
datasets have nothing to download: their stage writes only ``download.json`` and never touches the network, so
``dvc repro`` of the default params runs offline. A dataset with ``local_dir`` is read from there instead.
"""

from __future__ import annotations

import time

from noisydml import io
from noisydml.data import DatasetError
from noisydml.data.benchmarks import BENCHMARKS, DOWNLOADS, FILES
from noisydml.data.download import Archive, fetch_archive, fetch_url_list, place_file, safe_extract
from noisydml.data.registry import check_dataset
from noisydml.pipeline.layout import Layout


def download(params: dict, dataset: str, layout: Layout = Layout()) -> dict:
    cfg = check_dataset(params, dataset)
    out = layout.raw(dataset)
    out.mkdir(parents=True, exist_ok=True)
    progress = params.get("runtime", {}).get("progress", True)
    record: dict = {"dataset": dataset, "kind": cfg["kind"]}
    if cfg["kind"] not in BENCHMARKS:
        record["note"] = f"kind {cfg['kind']!r}: nothing to download"
    elif cfg["local_dir"]:
        record["note"] = f"files read from local_dir {cfg['local_dir']}; nothing downloaded"
    else:
        record.update(_fetch(dataset, cfg, out, progress))
    io.write_json(out / "download.json", record)
    print(f"download {dataset}: {record.get('note') or record['summary']}")
    return record


def _fetch(dataset: str, cfg: dict, out, progress: bool) -> dict:
    bench = BENCHMARKS[cfg["kind"]]
    downloads, tree = out / DOWNLOADS, out / FILES
    t0 = time.perf_counter()
    archives = []
    for built_in in bench.archives:
        override = cfg["archives"].get(built_in.filename, {})
        archive = Archive(built_in.filename, override.get("url", built_in.url),
                          override.get("sha256", built_in.sha256), built_in.where)
        path, sha, verified = fetch_archive(archive, downloads, progress=progress)
        if built_in.filename in bench.extract:
            safe_extract(path, tree, sha, progress=progress)
        else:
            place_file(path, tree)
        if not verified:
            print(f"warning: {archive.filename}: no published sha256 is pinned; its own is recorded in "
                  f"download.json ({sha})")
        archives.append({"file": archive.filename, "url": archive.url, "sha256": sha, "verified": verified})
    record = {"archives": archives}
    if bench.url_list is not None:
        _, listing = bench.url_list
        items = listing(tree, cfg)
        fetched = fetch_url_list(items, tree, retries=cfg["retries"], workers=cfg["fetch_workers"], progress=progress)
        io.write_with(tree / "fetched.csv", lambda p: fetched.to_csv(p, index=False))
        counts = fetched["status"].value_counts().to_dict()
        good = int(counts.get("ok", 0) + counts.get("present", 0))
        record["fetched"] = {"listed": int(len(fetched)), "available": good,
                             **{k: int(v) for k, v in counts.items()}}
        if good == 0:
            raise DatasetError(f"{dataset}: none of the {len(fetched)} listed images could be fetched (see "
                               f"{tree / 'fetched.csv'}); is this machine online?")
        print(f"{dataset}: {good} of {len(fetched)} listed images available; "
              f"{int(counts.get('dead', 0))} dead links, {int(counts.get('not_image', 0))} not images "
              f"(recorded in {tree / 'fetched.csv'})")
    record["summary"] = (f"{len(archives)} file(s) in place" + (
        f", {record['fetched']['available']} of {record['fetched']['listed']} images fetched"
        if "fetched" in record else "") + f" in {time.perf_counter() - t0:.1f}s")
    return record
