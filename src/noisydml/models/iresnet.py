"""iResNet: the "improved residual" face backbone of ArcFace (Deng et al. 2019; Duta et al. 2020), in the layout of
insightface's ``arcface_torch/backbones/iresnet.py``, so its published state dicts load by key (their weights are
for non-commercial research; none is fetched here: ``train.pretrained`` names a local file).

A block is BN -> 3x3 conv -> BN -> PReLU -> 3x3 conv (the stride here) -> BN, plus the shortcut (1x1 conv + BN
where the shape changes). Stem: 3x3 conv (stride 1), BN, PReLU; four stages of 64, 128, 256, 512 channels, each
halving the map (``width`` 64; a narrower network, ``train.iresnet_width``, is ours and loads no published
weights); then BN, flatten, a linear layer to ``num_features`` (512) and a BatchNorm1d whose scale is fixed
at 1. At ArcFace's 112 x 112 crop the last map is 7 x 7, which the linear layer flattens; a smaller input (ours:
the CPU miniatures at 32 px give 2 x 2) is average-pooled to 7 x 7 first, so the layer's shape, and the published
weights, stay valid. ``dropout``: arcface_torch's configs use 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: blocks per stage (arcface_torch: r18, r34, r50, r100)
DEPTHS = {"iresnet18": (2, 2, 2, 2), "iresnet34": (3, 4, 6, 3), "iresnet50": (3, 4, 14, 3),
          "iresnet100": (3, 13, 30, 3)}
WIDTHS = (64, 128, 256, 512)  # arcface_torch's stages; ``width`` scales them (ours when not 64)
FINAL_MAP = 7  # the last map's side at 112 px


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-5)


class IBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.bn1 = _bn(in_channels)
        self.conv1 = nn.Conv2d(in_channels, channels, 3, 1, 1, bias=False)
        self.bn2 = _bn(channels)
        self.prelu = nn.PReLU(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride, 1, bias=False)
        self.bn3 = _bn(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False), _bn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        return out + (x if self.downsample is None else self.downsample(x))


class IResNet(nn.Module):
    def __init__(self, depths: tuple[int, ...], in_channels: int = 3, num_features: int = 512, dropout: float = 0.0,
                 width: int = WIDTHS[0]):
        super().__init__()
        widths = tuple(width * 2 ** i for i in range(len(WIDTHS)))  # width 64: arcface_torch's WIDTHS
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = _bn(widths[0])
        self.prelu = nn.PReLU(widths[0])
        previous = widths[0]
        for i, (channels, blocks) in enumerate(zip(widths, depths), start=1):
            stage = [IBlock(previous, channels, 2)] + [IBlock(channels, channels, 1) for _ in range(blocks - 1)]
            setattr(self, f"layer{i}", nn.Sequential(*stage))
            previous = channels
        self.bn2 = _bn(previous)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(previous * FINAL_MAP * FINAL_MAP, num_features)
        self.features = nn.BatchNorm1d(num_features, eps=1e-5)
        nn.init.ones_(self.features.weight)
        self.features.weight.requires_grad_(False)  # arcface_torch: the embedding's BN scale stays 1
        for m in self.modules():  # arcface_torch's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        self.out_dim = num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prelu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.bn2(x)
        if x.shape[-2:] != (FINAL_MAP, FINAL_MAP):
            x = F.adaptive_avg_pool2d(x, FINAL_MAP)
        return self.features(self.fc(self.dropout(torch.flatten(x, 1))))
