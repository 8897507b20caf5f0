"""The prepare stage: a dataset's params section -> ``data/prepared/<dataset>``."""

from __future__ import annotations

import time

from noisydml.data.registry import check_dataset, prepare_dataset
from noisydml.pipeline.layout import Layout


def prepare(params: dict, dataset: str, layout: Layout = Layout()) -> dict:
    cfg = check_dataset(params, dataset)
    t0 = time.perf_counter()
    info = prepare_dataset(dataset, cfg, layout.prepared(dataset), base_dir=layout.root)
    print(
        f"prepared {dataset}: {info['num_samples']} images, {info['num_classes']} classes "
        f"({info['num_train_classes']} train / {info['num_test_classes']} test) in {time.perf_counter() - t0:.1f}s"
    )
    return info
