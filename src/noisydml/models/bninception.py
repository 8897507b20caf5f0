"""BN-Inception (Ioffe & Szegedy, "Batch Normalization", ICML 2015): PRISM's and SGPS's backbone on CUB, Cars196
and CARS-98N.

No maintained model library has it (timm and torchvision do not), so it is written here, with parameter names in
the key layout of the ImageNet weights the DML literature uses: Cadene's ``pretrainedmodels`` port of the Caffe
model (``bn_inception-52deb4733.pth``: ``conv1_7x7_s2.weight``, ``conv1_7x7_s2_bn.running_mean``,
``inception_3a_double_3x3_reduce.weight``, ..., ``last_linear.weight``). Those weights expect BGR images in
[0, 255] minus the mean (104, 117, 128) (``train.input.normalisation: caffe_bgr``).

The network ends at the 1024-channel map of ``inception_5b``; the embedding network pools it
(``train.pooling``: the papers take global max pooling for BN-Inception) and the 512-d head follows.
"""

from __future__ import annotations

import torch
from torch import nn

#: (name, in channels, 1x1, 3x3 reduce, 3x3, double 3x3 reduce, double 3x3, pool kind, pool projection, stride)
#: of each Inception module, as in the paper's Table (Fig. 5 of the Inception-v2 paper) and the published weights.
#: A stride-2 module has no 1x1 branch and no pool projection (0): its pool branch is max-pooled input.
MODULES = (
    ("3a", 192, 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 256, 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 320, 0, 128, 160, 64, 96, "max", 0, 2),
    ("4a", 576, 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 576, 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 576, 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 608, 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 608, 0, 128, 192, 192, 256, "max", 0, 2),
    ("5a", 1056, 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 1024, 352, 192, 320, 192, 224, "max", 128, 1),
)


def _conv_bn(owner: nn.Module, name: str, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0):
    """A convolution and its batch norm, registered under the published names ``<name>`` and ``<name>_bn``."""
    owner.add_module(name, nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding))
    owner.add_module(f"{name}_bn", nn.BatchNorm2d(cout, eps=1e-5, affine=True))


class BNInception(nn.Module):
    """BN-Inception's convolutional trunk; ``forward`` returns the (N, 1024, h, w) map of ``inception_5b``.

    Layers are attributes of this module with the published names (``inception_3a_1x1`` ...), and
    ``last_linear`` (1024 -> 1000, the ImageNet classifier) exists so that the published state dict loads as it
    is; the embedding network never calls it."""

    out_dim = 1024

    def __init__(self, in_channels: int = 3):
        super().__init__()
        _conv_bn(self, "conv1_7x7_s2", in_channels, 64, 7, stride=2, padding=3)
        _conv_bn(self, "conv2_3x3_reduce", 64, 64, 1)
        _conv_bn(self, "conv2_3x3", 64, 192, 3, padding=1)
        for name, cin, c1, r3, c3, rd, cd, _pool, proj, stride in MODULES:
            prefix = f"inception_{name}"
            if c1:
                _conv_bn(self, f"{prefix}_1x1", cin, c1, 1)
            _conv_bn(self, f"{prefix}_3x3_reduce", cin, r3, 1)
            _conv_bn(self, f"{prefix}_3x3", r3, c3, 3, stride=stride, padding=1)
            _conv_bn(self, f"{prefix}_double_3x3_reduce", cin, rd, 1)
            _conv_bn(self, f"{prefix}_double_3x3_1", rd, cd, 3, padding=1)
            _conv_bn(self, f"{prefix}_double_3x3_2", cd, cd, 3, stride=stride, padding=1)
            if proj:
                _conv_bn(self, f"{prefix}_pool_proj", cin, proj, 1)
        self.last_linear = nn.Linear(1024, 1000)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(3, stride=2, ceil_mode=True)

    def _unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.relu(getattr(self, f"{name}_bn")(getattr(self, name)(x)))

    def _inception(self, spec, x: torch.Tensor) -> torch.Tensor:
        name, _cin, c1, _r3, _c3, _rd, _cd, pool, proj, stride = spec
        p = f"inception_{name}"
        branches = []
        if c1:
            branches.append(self._unit(f"{p}_1x1", x))
        branches.append(self._unit(f"{p}_3x3", self._unit(f"{p}_3x3_reduce", x)))
        double = self._unit(f"{p}_double_3x3_1", self._unit(f"{p}_double_3x3_reduce", x))
        branches.append(self._unit(f"{p}_double_3x3_2", double))
        if stride == 2:
            branches.append(nn.functional.max_pool2d(x, 3, stride=2, ceil_mode=True))
        else:
            pooled = (nn.functional.avg_pool2d(x, 3, stride=1, padding=1, ceil_mode=True, count_include_pad=True)
                      if pool == "avg" else nn.functional.max_pool2d(x, 3, stride=1, padding=1, ceil_mode=True))
            branches.append(self._unit(f"{p}_pool_proj", pooled))
        return torch.cat(branches, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self._unit("conv1_7x7_s2", x))
        x = self.pool(self._unit("conv2_3x3", self._unit("conv2_3x3_reduce", x)))
        for spec in MODULES:
            x = self._inception(spec, x)
        return x
