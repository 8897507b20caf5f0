"""``noisydml verify``: a published face backbone evaluated as published, on a prepared face dataset's verification
sets, by the same protocols as the runs (:mod:`noisydml.pipeline.face_eval`).

An iResNet state dict in arcface_torch's layout (``backbone.pth`` of insightface's model zoo; its weights are for
non-commercial research and are never fetched here) loads into :mod:`noisydml.models.iresnet` by key; its 512-d
output (the BatchNorm1d ``features``) is the face feature, with no head of ours on top and no normalisation, and
the images are scaled as arcface_torch's evaluation scales them (RGB, ``(x / 255 - 0.5) / 0.5``). Then, as for a
run: the ``.bin`` sets' 10-fold accuracy and VAL at FAR, the IJB set's TAR at FAR (``--tar-reading``)::

    dvc repro prepare@faces      # or your MS1MV2 / IJB-C entry (README "Face recognition")
    noisydml verify --weights ms1mv2_r50/backbone.pth --backbone iresnet50 --dataset faces
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# torch, numpy and the protocols are imported where used: `noisydml verify --help` answers before them
BATCH_IMAGES = 256
#: evaluate.tar_reading's choices (noisydml.evaluation.verification.TAR_READINGS)
TAR_READINGS = ("strict", "insightface")


def load_published(backbone: str, weights: str | Path) -> "torch.nn.Module":
    """The iResNet ``backbone`` with the state dict at ``weights`` (every key matched; shapes checked)."""
    import torch

    from noisydml.models import BACKBONES, IRESNET_PUBLISHED_WIDTH, load_backbone_weights

    if not backbone.startswith("iresnet") or backbone not in BACKBONES:
        allowed = ", ".join(name for name in BACKBONES if name.startswith("iresnet"))
        raise SystemExit(f"--backbone: {backbone!r}; allowed: {allowed} (arcface_torch's layout)")
    net = BACKBONES[backbone](3, {"pooling": "avg", "iresnet_width": IRESNET_PUBLISHED_WIDTH})
    state = torch.load(weights, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    load_backbone_weights(net, state, str(weights))
    return net.eval()


def published_embedder(net: "torch.nn.Module", device: "torch.device"):
    """``images (N, H, W, 3) uint8 -> (N, 512)``: the network's raw output, arcface_torch's input scaling."""
    import numpy as np
    import torch

    @torch.no_grad()
    def embedder(images: np.ndarray) -> np.ndarray:
        out = []
        for start in range(0, len(images), BATCH_IMAGES):
            x = torch.from_numpy(np.ascontiguousarray(images[start:start + BATCH_IMAGES])).to(device)
            x = (x.permute(0, 3, 1, 2).float() / 255.0 - 0.5) / 0.5
            out.append(net(x).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    return embedder


def verify(weights: str | Path, backbone: str, prepared_dir: str | Path, tar_reading: str = "strict",
           device: str = "cpu") -> dict:
    """The verification metrics (%) of published weights on a prepared face folder."""
    import torch

    from noisydml.pipeline.face_eval import verification_metrics
    from noisydml.pipeline.face_features import has_verification, verification_embeddings

    prepared_dir = Path(prepared_dir)
    if not has_verification(prepared_dir):
        raise SystemExit(f"{prepared_dir}: no verification sets (verification/*.bin or verification/IJB); prepare a "
                         "face dataset first: dvc repro prepare@<name>")
    torch_device = torch.device(device)
    net = load_published(backbone, weights).to(torch_device)
    saved = verification_embeddings(published_embedder(net, torch_device), prepared_dir)
    return verification_metrics(saved, prepared_dir, tar_reading)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="noisydml verify", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="a state dict in arcface_torch's iResNet layout (.pth/.pt)")
    parser.add_argument("--backbone", required=True, help="iresnet18 | iresnet34 | iresnet50 | iresnet100")
    parser.add_argument("--dataset", required=True, help="a prepared face dataset of params.yaml (data/prepared/<name>)")
    parser.add_argument("--tar-reading", default="strict", choices=TAR_READINGS,
                        help="TAR at FAR: strict (ours: FAR <= f) or insightface (the ROC point nearest f)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--out", help="also write the metrics here (JSON)")
    args = parser.parse_args(argv)
    from noisydml.pipeline.layout import Layout

    metrics = verify(args.weights, args.backbone, Layout().prepared(args.dataset), args.tar_reading, args.device)
    for key in sorted(metrics):
        print(f"{key:<40} {metrics[key]:.4f}" if isinstance(metrics[key], float) else f"{key:<40} {metrics[key]}")
    if args.out:
        Path(args.out).write_text(json.dumps(metrics, indent=1, sort_keys=True))
    return 0
