"""Where a run's backbone starts (``train.pretrained``): the weights the train stage loads (the timing stage
measures seconds and starts from random weights).

Apart from :mod:`noisydml.pipeline.pretrain` so that a train stage imports (and DVC tracks) the loading code
only, not the pretraining code; it depends on the pretrain stage's output instead.
"""

from __future__ import annotations

from pathlib import Path

import torch

from noisydml.data.prepared import sha256_file
from noisydml.pipeline.layout import PRETRAINED_WEIGHTS, Layout


def load_pretrained(params: dict, layout: Layout) -> tuple[dict | None, dict]:
    """The backbone weights a run starts from, and what the run fingerprint records of them.

    Returns ``(state_dict or None, {"source", "sha256"})``; ``(None, {})`` for ``none`` and ``imagenet``
    (torchvision builds those itself)."""
    source = params["train"]["pretrained"]
    if source in ("none", "imagenet"):
        return None, {}
    staged = source == "embedded" or source in params["weights"]  # the pretrain stage's output
    path = layout.pretrained / PRETRAINED_WEIGHTS if staged else Path(source)
    if not path.is_file():
        hint = ("run `dvc repro` (the pretrain stage makes it)" if staged
                else "train.pretrained names a file that does not exist")
        raise FileNotFoundError(f"pretrained weights {path}: missing; {hint}")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if staged:
        if source != saved.get("weights", "embedded"):
            raise ValueError(f"{path}: holds {saved.get('weights', 'embedded')!r} weights, train.pretrained is "
                             f"{source!r}; run `dvc repro` (the pretrain stage re-makes it)")
        for key in ("backbone_name", "backbone_width"):
            want = params["train"][key.replace("_name", "")]
            if saved[key] != want:
                raise ValueError(f"{path}: pretrained for train.{key.replace('_name', '')} {saved[key]!r}, the run "
                                 f"uses {want!r}; run `dvc repro` (the pretrain stage re-makes it)")
        state = saved["backbone"]
    else:
        state = saved.get("state_dict", saved) if isinstance(saved, dict) else saved
    return state, {"source": source, "sha256": sha256_file(path)}
