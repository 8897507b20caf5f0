"""Backbones and the embedding network (backbone -> linear head -> L2 normalisation).

``small_cnn`` is the CPU default for the embedded dataset; the torchvision
ResNets are for the paper profile (``pretrained: true`` loads ImageNet weights,
which needs the internet once, or torch's cache).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from noisydml.schema import check_choice


class SmallCNN(nn.Module):
    """Four 3x3 conv blocks (width, 2w, 4w, 4w channels), each BN + ReLU + 2x2 max-pool, then global average pooling."""

    def __init__(self, in_channels: int, width: int = 16):
        super().__init__()
        channels = [width, 2 * width, 4 * width, 4 * width]
        layers: list[nn.Module] = []
        prev = in_channels
        for c in channels:
            layers += [nn.Conv2d(prev, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            prev = c
        self.features = nn.Sequential(*layers)
        self.out_dim = prev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)


def _torchvision_resnet(name: str) -> Callable[[int, dict], nn.Module]:
    def build(in_channels: int, cfg: dict) -> nn.Module:
        import torchvision

        weights = "DEFAULT" if cfg["pretrained"] else None
        net = getattr(torchvision.models, name)(weights=weights)
        if in_channels != 3:
            # Grey images: repeat them to 3 channels rather than drop the pretrained stem.
            stem = nn.Sequential(_RepeatChannels(3), net.conv1) if in_channels == 1 else None
            if stem is None:
                raise ValueError(f"{name}: images with {in_channels} channels are not supported (1 or 3)")
            net.conv1 = stem
        out_dim = net.fc.in_features
        net.fc = nn.Identity()
        net.out_dim = out_dim
        return net

    return build


class _RepeatChannels(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def forward(self, x):
        return x.expand(-1, self.channels, -1, -1)


BACKBONES: dict[str, Callable[[int, dict], nn.Module]] = {
    "small_cnn": lambda in_channels, cfg: SmallCNN(in_channels, cfg["backbone_width"]),
    "resnet18": _torchvision_resnet("resnet18"),
    "resnet50": _torchvision_resnet("resnet50"),
}


class EmbeddingNet(nn.Module):
    """f(x) = normalize(W . backbone(x)): L2-normalised embeddings, as every method here expects."""

    def __init__(self, backbone: nn.Module, embedding_dim: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.out_dim, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.backbone(x)), dim=1)

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L2-normalised embeddings, backbone features)`` of one forward pass."""
        features = self.backbone(x)
        return F.normalize(self.head(features), dim=1), features


def build_model(train_cfg: dict, in_channels: int) -> EmbeddingNet:
    backbone = BACKBONES[train_cfg["backbone"]](in_channels, train_cfg)
    return EmbeddingNet(backbone, train_cfg["embedding_dim"])


def check_backbone(train_cfg: dict) -> None:
    """``train.backbone`` must be one of :data:`BACKBONES`."""
    check_choice(train_cfg["backbone"], list(BACKBONES), "train.backbone", "backbone")
