"""Dataset kind ``faces``: face recognition (SGPS's Table IV), synthetic identities in insightface's formats or
insightface's own files (:mod:`noisydml.data.faces`); after training, the train stage embeds its verification
sets (:mod:`noisydml.pipeline.face_features`), which the evaluate stage scores."""

from __future__ import annotations

from noisydml.data import faces
from noisydml.data.registry import DatasetKind


def _train_classes(cfg: dict) -> int | None:
    if cfg["source"] == "synthetic":
        return cfg["train_identities"]
    release = faces.FACE_RELEASES.get(cfg["release"])  # a range where no exact count is published: its top
    return release.identities[1] - cfg["test_identities"] if release else None


KIND = DatasetKind(schema=faces.schema(), prepare=faces.prepare, extra_check=faces.check,
                   train_classes=_train_classes, after_training="noisydml.pipeline.face_features")
