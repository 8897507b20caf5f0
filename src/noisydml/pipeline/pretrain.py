"""The pretrain stage: ``train.pretrained: embedded`` -> ``data/pretrained/`` (backbone weights and a card).

Renders the source set ``pretrain.source`` names -- glyphs (characters disjoint from every class of the
``glyphs`` dataset, :func:`noisydml.data.glyphs.source_chars`) or motifs (genera disjoint from every class of the
``motifs`` dataset, :func:`noisydml.data.motifs.source_genera`) -- and trains
``train.backbone`` to classify it (:mod:`noisydml.engine.pretrain`). Every train
stage depends on ``data/pretrained/``: with another ``train.pretrained`` the
stage writes only a card saying so (no training), and the runs start from
their own source.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import torch

from noisydml import io
from noisydml.data.prepared import sha256_file
from noisydml.models import check_backbone
from noisydml.pipeline.layout import PRETRAINED_WEIGHTS, Layout


def pretrain(params: dict, layout: Layout = Layout()) -> dict:
    train_cfg, cfg = params["train"], params["pretrain"]
    check_backbone(train_cfg, params["weights"])
    out = layout.pretrained
    if train_cfg["pretrained"] in params["weights"]:
        return fetch_published_weights(train_cfg, train_cfg["pretrained"], params["weights"][train_cfg["pretrained"]],
                                       layout, progress=params["runtime"]["progress"])
    if train_cfg["pretrained"] != "embedded":
        card = {"pretrained": train_cfg["pretrained"], "trained_here": False,
                "note": "train.pretrained is not 'embedded': nothing to pretrain; runs start from their own source"}
        with io.atomic_dir(out) as tmp:
            io.write_json(tmp / "card.json", card)
        print(f"pretrain: train.pretrained is {train_cfg['pretrained']!r}; nothing to pretrain")
        return card

    from noisydml.engine.pretrain import pretrain_backbone

    if params["runtime"]["threads"]:
        torch.set_num_threads(params["runtime"]["threads"])
    t0 = time.perf_counter()
    if cfg["source"] == "motifs":
        from noisydml.data.motifs import generate_source
    elif cfg["source"] == "faces":
        from noisydml.data.faces import generate_source
    else:
        from noisydml.data.glyphs import generate_source
    images, labels, names = generate_source(cfg["classes"], cfg["images_per_class"], cfg["image_size"], cfg["seed"])
    print(f"pretrain: rendered {len(images)} images of {len(names)} source classes ({cfg['source']}) in "
          f"{time.perf_counter() - t0:.1f}s")
    state, measured = pretrain_backbone(train_cfg, cfg, images, labels, progress=params["runtime"]["progress"])
    with io.atomic_dir(out) as tmp:
        torch.save({"backbone": state, "backbone_name": train_cfg["backbone"],
                    "backbone_width": train_cfg["backbone_width"], "in_channels": int(images.shape[-1])},
                   tmp / PRETRAINED_WEIGHTS)
        card = {
            "pretrained": "embedded", "trained_here": True,
            "backbone": train_cfg["backbone"], "backbone_width": train_cfg["backbone_width"],
            "objective": "cross-entropy over the source classes (linear classifier, dropped afterwards)",
            "settings": cfg,
            "source_characters": names,
            "images": int(len(images)),
            **measured,
            "images_sha256": _sha256_array(images),
            "weights_sha256": sha256_file(tmp / PRETRAINED_WEIGHTS),
        }
        io.write_json(tmp / "card.json", card)
    return card


def fetch_published_weights(train_cfg: dict, name: str, entry: dict, layout: Layout, progress: bool = True) -> dict:
    """``train.pretrained`` names published weights (params.yaml ``weights``): download them once into
    ``data/raw/weights`` (resumable, sha256-checked; a file put there by hand is checked and used), check they
    are a state dict of ``train.backbone`` in its published key layout (every backbone tensor present, shapes
    equal), and store them as the pretrain stage's output, a DVC dependency of every run."""
    from noisydml.data.download import Archive, fetch_archive
    from noisydml.models import BACKBONES, load_backbone_weights

    filename = entry["url"].rsplit("/", 1)[-1] or f"{name}.pth"
    archive = Archive(filename, entry["url"], entry["sha256"], entry["where"])
    path, sha, _ = fetch_archive(archive, layout.raw("weights"), progress=progress)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    state = saved.get("state_dict", saved) if isinstance(saved, dict) else saved
    state = {k.removeprefix("module."): v for k, v in state.items()}  # saved from DataParallel
    backbone = BACKBONES[train_cfg["backbone"]](3, train_cfg)
    load_backbone_weights(backbone, state, f"{path} (weights.{name})")  # raises on a wrong layout
    own = backbone.state_dict()
    with io.atomic_dir(layout.pretrained) as tmp:
        torch.save({"backbone": backbone.state_dict(), "backbone_name": train_cfg["backbone"],
                    "backbone_width": train_cfg["backbone_width"], "in_channels": 3, "weights": name},
                   tmp / PRETRAINED_WEIGHTS)
        card = {"pretrained": name, "trained_here": False, "backbone": train_cfg["backbone"],
                "url": entry["url"], "file": filename, "file_sha256": sha, "pinned_sha256": entry["sha256"],
                "tensors": len(own), "ignored_keys": sorted(set(state) - set(own)),
                "weights_sha256": sha256_file(tmp / PRETRAINED_WEIGHTS)}
        io.write_json(tmp / "card.json", card)
    print(f"pretrain: weights.{name} ({filename}, sha256 {sha[:16]}...) checked against {train_cfg['backbone']}: "
          f"{len(own)} tensors; ignored {len(card['ignored_keys'])} classifier key(s)")
    return card


def _sha256_array(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
