"""Backbones and the embedding network (backbone -> linear head -> L2 normalisation).

``small_cnn`` is the CPU default for the embedded dataset; the torchvision
ResNets and BN-Inception (:mod:`noisydml.models.bninception`) are for the paper profile, the iResNets
(:mod:`noisydml.models.iresnet`) for face recognition. Every backbone ends in a
global pooling of its last feature map (``train.pooling``: avg, max, or avg+max summed as Proxy-Anchor's code
does); ``train.frozen_bn`` keeps its batch-norm layers at their loaded statistics (eval mode, affine parameters
fixed), as the DML papers' code does with ImageNet weights. Where a backbone starts is ``train.pretrained``:

- ``none``: random initialisation (from scratch);
- ``embedded``: the weights of the ``pretrain`` stage (the backbone trained to classify
  other glyphs, :mod:`noisydml.engine.pretrain`), ``data/pretrained/backbone.pt``;
- ``imagenet``: torchvision's ImageNet weights for the ResNets (needs the internet once, or torch's cache);
- a name in params.yaml's ``weights`` section: published weights (BN-Inception's, ResNet-50's V1), fetched and
  sha256-checked by the pretrain stage into ``data/pretrained`` (a DVC dependency of every run);
- a path to a weights file (``.pt``/``.pth``: a state dict of the backbone, e.g. a torchvision or timm
  ResNet's; its classifier keys are ignored), for the paper profile on a machine without internet.

Loaded weights adapt to the images' channels (:func:`adapt_first_layer`).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from noisydml.schema import ParamsError, ParamsErrors, check_choice, did_you_mean


POOLINGS = ("avg", "max", "avg+max")


class GlobalPool(nn.Module):
    """Global pooling of a (N, C, h, w) map to (N, C): ``avg``, ``max``, or ``avg+max`` (their sum)."""

    def __init__(self, kind: str = "avg"):
        super().__init__()
        if kind not in POOLINGS:
            raise ValueError(f"pooling {kind!r}; allowed: {', '.join(POOLINGS)}")
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "avg":
            return F.adaptive_avg_pool2d(x, 1).flatten(1)
        if self.kind == "max":
            return F.adaptive_max_pool2d(x, 1).flatten(1)
        return (F.adaptive_avg_pool2d(x, 1) + F.adaptive_max_pool2d(x, 1)).flatten(1)


class SmallCNN(nn.Module):
    """Four 3x3 conv blocks (width, 2w, 4w, 4w channels), each BN + ReLU + 2x2 max-pool, then global pooling."""

    def __init__(self, in_channels: int, width: int = 16, pooling: str = "avg"):
        super().__init__()
        channels = [width, 2 * width, 4 * width, 4 * width]
        layers: list[nn.Module] = []
        prev = in_channels
        for c in channels:
            layers += [nn.Conv2d(prev, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            prev = c
        self.features = nn.Sequential(*layers)
        self.pool = GlobalPool(pooling)
        self.out_dim = prev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.features(x))


def _torchvision_resnet(name: str) -> Callable[[int, dict], nn.Module]:
    def build(in_channels: int, cfg: dict) -> nn.Module:
        import torchvision

        weights = "DEFAULT" if cfg["pretrained"] == "imagenet" else None
        net = getattr(torchvision.models, name)(weights=weights)
        if in_channels != 3:
            # Grey images: repeat them to 3 channels rather than drop the pretrained stem.
            stem = nn.Sequential(_RepeatChannels(3), net.conv1) if in_channels == 1 else None
            if stem is None:
                raise ValueError(f"{name}: images with {in_channels} channels are not supported (1 or 3)")
            net.conv1 = stem
        out_dim = net.fc.in_features
        net.fc = nn.Identity()
        net.avgpool = GlobalPool(cfg["pooling"])  # torchvision flattens after it (a no-op on (N, C))
        net.out_dim = out_dim
        return net

    return build


def _bn_inception(in_channels: int, cfg: dict) -> nn.Module:
    from noisydml.models.bninception import BNInception

    class PooledBNInception(BNInception):
        def __init__(self):
            super().__init__(in_channels)
            self.global_pool = GlobalPool(cfg["pooling"])

        def forward(self, x):
            return self.global_pool(super().forward(x))

    return PooledBNInception()


class _RepeatChannels(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def forward(self, x):
        return x.expand(-1, self.channels, -1, -1)


def _iresnet(name: str) -> Callable[[int, dict], nn.Module]:
    def build(in_channels: int, cfg: dict) -> nn.Module:
        from noisydml.models.iresnet import DEPTHS, IResNet

        if cfg["pooling"] != "avg":  # no global pooling: the linear layer flattens the 7 x 7 map
            raise ParamsError(f"train.pooling: {cfg['pooling']!r} with train.backbone {name!r}, which flattens its "
                              "last map (no global pooling); allowed: avg")
        return IResNet(DEPTHS[name], in_channels, width=cfg["iresnet_width"])

    return build


BACKBONES: dict[str, Callable[[int, dict], nn.Module]] = {
    "small_cnn": lambda in_channels, cfg: SmallCNN(in_channels, cfg["backbone_width"], cfg["pooling"]),
    "resnet18": _torchvision_resnet("resnet18"),
    "resnet50": _torchvision_resnet("resnet50"),
    "bn_inception": _bn_inception,
    # ArcFace's face backbones (arcface_torch's layout, :mod:`noisydml.models.iresnet`), 512-d features
    "iresnet18": _iresnet("iresnet18"),
    "iresnet34": _iresnet("iresnet34"),
    "iresnet50": _iresnet("iresnet50"),
    "iresnet100": _iresnet("iresnet100"),
}


class EmbeddingNet(nn.Module):
    """f(x) = normalize(W . backbone(x)): L2-normalised embeddings, as every method here expects."""

    def __init__(self, backbone: nn.Module, embedding_dim: int, frozen_bn: bool = False):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.out_dim, embedding_dim)
        self.frozen_bn = frozen_bn
        if frozen_bn:
            for module in self._batch_norms():
                for p in module.parameters():
                    p.requires_grad_(False)

    def set_frozen(self, frozen: tuple[str, ...]) -> None:
        """Train every top-level part (``backbone``, ``head``) but those in ``frozen`` (a method's choice per epoch);
        with ``frozen_bn`` the batch-norm affine parameters stay frozen whatever the method says."""
        for name, module in self.named_children():
            module.requires_grad_(name not in frozen)
        if self.frozen_bn:
            for module in self._batch_norms():
                for p in module.parameters():
                    p.requires_grad_(False)

    def _batch_norms(self):
        return [m for m in self.backbone.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen_bn:  # running statistics stay the loaded ones
            for module in self._batch_norms():
                module.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.backbone(x)), dim=1)

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L2-normalised embeddings, backbone features)`` of one forward pass."""
        features = self.backbone(x)
        return F.normalize(self.head(features), dim=1), features


def build_model(train_cfg: dict, in_channels: int) -> EmbeddingNet:
    backbone = BACKBONES[train_cfg["backbone"]](in_channels, train_cfg)
    return EmbeddingNet(backbone, train_cfg["embedding_dim"], train_cfg["frozen_bn"])


def check_backbone(train_cfg: dict, weight_names=()) -> None:
    """``train.backbone`` must be one of :data:`BACKBONES`; ``train.pretrained`` a source it can start from
    (``weight_names``: the entries of params.yaml's ``weights``)."""
    backbone, problems = train_cfg["backbone"], []
    if backbone not in BACKBONES:
        # a near miss within the same kind of network (resnet34 is not a typo of the face network iresnet34)
        face = [name for name in BACKBONES if name.startswith("iresnet")]
        retrieval = [name for name in BACKBONES if name not in face]
        kin = face if str(backbone).startswith("iresnet") else retrieval
        problems.append(f"train.backbone: unknown backbone {backbone!r}{did_you_mean(backbone, kin)}; allowed: "
                        f"{', '.join(sorted(retrieval))} (image retrieval), {', '.join(sorted(face))} (face "
                        "recognition, 112-px faces)")
    pretrained = train_cfg["pretrained"]
    if (str(backbone).startswith("iresnet") and train_cfg["iresnet_width"] != IRESNET_PUBLISHED_WIDTH
            and (pretrained in weight_names or str(pretrained).endswith((".pt", ".pth")))):
        problems.append(f"train.iresnet_width: {train_cfg['iresnet_width']} with train.pretrained {pretrained!r}: "
                        f"published iResNet weights have width {IRESNET_PUBLISHED_WIDTH}; allowed: "
                        f"{IRESNET_PUBLISHED_WIDTH}, or train.pretrained none / embedded")
    if pretrained in weight_names:
        pass
    elif pretrained == "imagenet" and not str(backbone).startswith("resnet"):
        problems.append(f"train.pretrained: 'imagenet' weights exist for the ResNets only, not "
                        f"{train_cfg['backbone']!r}; allowed here: none, embedded, or a weights file")
    elif pretrained not in PRETRAINED_SOURCES and not str(pretrained).endswith((".pt", ".pth")):
        problems.append(f"train.pretrained: {pretrained!r} is not allowed"
                        f"{did_you_mean(pretrained, [*PRETRAINED_SOURCES, *weight_names])}; allowed: "
                        f"{', '.join(PRETRAINED_SOURCES)}, a name in `weights` "
                        f"({', '.join(weight_names) or 'none defined'}), or a path to a .pt/.pth weights file")
    if problems:
        raise ParamsErrors(problems)


#: arcface_torch's iResNet width (its first stage's channels), the width of every published iResNet state dict
IRESNET_PUBLISHED_WIDTH = 64

#: ``train.pretrained`` values other than a weights file's path.
PRETRAINED_SOURCES = ("none", "embedded", "imagenet")


def adapt_first_layer(state: dict[str, torch.Tensor], backbone: nn.Module) -> dict[str, torch.Tensor]:
    """Make a state dict's first convolution take the backbone's number of input channels.

    Grey weights (1 channel) on colour images: the kernel is repeated over the 3 channels and divided by 3,
    so an image whose 3 channels are equal gives the response the grey image gave. Colour weights on grey
    images: the kernel is summed over its channels, the same as feeding the grey image repeated 3 times.
    """
    own = backbone.state_dict()
    out = dict(state)
    first = next((k for k, v in own.items() if v.dim() == 4), None)  # the first convolution's kernel
    if first is None or first not in state or state[first].dim() != 4:
        return out
    have, want = state[first].shape[1], own[first].shape[1]
    if have != want:
        if have == 1:
            out[first] = state[first].repeat(1, want, 1, 1) / want
        elif want == 1:
            out[first] = state[first].sum(1, keepdim=True)
        else:
            raise ValueError(f"pretrained weights: {first} takes {have} channels, the images have {want}")
    return out


def load_backbone_weights(backbone: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load pretrained weights into ``backbone``: every backbone key must be matched (a classifier's extra keys,
    such as torchvision's ``fc.*``, are ignored); shapes other than the first layer's channels must agree."""
    own = backbone.state_dict()
    # grey images on a ResNet: conv1 is Sequential(repeat-to-3-channels, conv1), so its weight is conv1.1.*
    state = {**{k: state[k.replace("conv1.1.", "conv1.", 1)] for k in own
                if k.startswith("conv1.1.") and k not in state and k.replace("conv1.1.", "conv1.", 1) in state},
             **state}
    state = adapt_first_layer(state, backbone)
    # files saved before PyTorch 0.4.1 (BN-Inception's) have no batch-norm step counters: start them at 0
    state = {**{k: own[k] for k in own if k.endswith("num_batches_tracked") and k not in state}, **state}
    missing = [k for k in own if k not in state]
    if missing:
        raise ValueError(f"pretrained weights {source}: {len(missing)} of the backbone's {len(own)} tensors are "
                         f"missing (first: {missing[0]!r}); is it a state dict of train.backbone?")
    wrong = [k for k in own if state[k].shape != own[k].shape]
    if wrong:
        raise ValueError(f"pretrained weights {source}: {wrong[0]!r} has shape {tuple(state[wrong[0]].shape)}, the "
                         f"backbone's is {tuple(own[wrong[0]].shape)}")
    backbone.load_state_dict({k: state[k] for k in own})
