"""The prepare stage: a dataset's params section -> ``data/prepared/<dataset>``."""

from __future__ import annotations

import time

from noisydml.data.prepared import SPLITS
from noisydml.data.registry import check_dataset, prepare_dataset
from noisydml.pipeline.layout import Layout


def prepare(params: dict, dataset: str, layout: Layout = Layout()) -> dict:
    cfg = check_dataset(params, dataset)
    t0 = time.perf_counter()
    workers = params.get("runtime", {}).get("prepare_workers", 0)
    info = prepare_dataset(dataset, cfg, layout.prepared(dataset), base_dir=layout.root, workers=workers)
    parts = " / ".join(f"{info[f'num_{s}_classes']} {s}" for s in SPLITS if f"num_{s}_samples" in info
                       and info[f"num_{s}_samples"])
    print(f"prepared {dataset}: {info['num_samples']} images, {info['num_classes']} classes ({parts}) "
          f"in {time.perf_counter() - t0:.1f}s")
    return info
