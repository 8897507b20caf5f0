"""The noisy-label *classification* baselines' common ground (PRISM Tables 1-3, SGPS Tables I-III).

SGPS (Sec. IV-B) says how the papers ran them on retrieval data: "train the classification baselines with the
cross-entropy loss and retrieve with the l2-normalized features from the penultimate layer". Here:

- the classifier sits on the backbone's features (the penultimate layer of a classification network) and retrieval
  ranks with those features L2-normalised (``Method.retrieval = "features"``); the embedding head is not trained
  (frozen: it feeds nothing these methods use);
- ``classifier: linear`` is a linear layer with bias (plain cross-entropy); ``classifier: normalized`` is the
  normalised softmax with temperature (Zhai & Wu 2019, PRISM's reference [53]: logits ``cos(f, w_c) / T``), the
  classifier of "Co-teaching w/ T".

``cross_entropy_per_sample`` gives the per-sample losses the small-loss rules rank; :class:`Classifier` is one
network's classifier, :class:`PeerNetwork` a second network with its own classifier (Co-teaching's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from noisydml.methods.base import Batch, Method, MethodSetup, Trainable, services_of
from noisydml.schema import Field

CLASSIFIERS = ("linear", "normalized")

#: Hyper-parameters every method of the family takes.
CLASSIFIER_FIELDS: dict[str, Field] = {
    "classifier": Field(str, "linear", choices=CLASSIFIERS,
                        help="linear: a linear layer with bias (cross-entropy); normalized: the normalised softmax "
                             "with temperature (Zhai & Wu 2019), Co-teaching w/ T's"),
    "temperature": Field(float, 0.05, min=1e-6,
                         help="the normalised softmax's temperature (classifier: normalized; Zhai & Wu's 0.05)"),
    "lr_multiplier": Field(float, 100.0, min=0.0,
                           help="ours: the classifier's learning rate / train's (100, as normalized_softmax's "
                                "proxies: a new layer on a pretrained backbone)"),
}


class Classifier(nn.Module):
    """Logits over the training classes from backbone features: ``W f + b`` or ``cos(f, w_c) / T``."""

    def __init__(self, feature_dim: int, num_classes: int, kind: str, temperature: float):
        super().__init__()
        if kind not in CLASSIFIERS:
            raise ValueError(f"classifier {kind!r}; allowed: {', '.join(CLASSIFIERS)}")
        self.kind, self.temperature = kind, temperature
        self.layer = nn.Linear(feature_dim, num_classes, bias=kind == "linear")

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.kind == "linear":
            return self.layer(features)
        return F.normalize(features, dim=1) @ F.normalize(self.layer.weight, dim=1).T / self.temperature


def cross_entropy_per_sample(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="none")


class PeerNetwork(nn.Module):
    """A second network (backbone + head, from :meth:`MethodServices.build_network`) and its own classifier."""

    def __init__(self, setup: MethodSetup, classifier: Classifier, train_head: bool = False):
        super().__init__()
        self.network = services_of(setup, "this method (it trains a second network)").build_network()
        # the classifier uses the features only; the head trains where a method uses it (UNICON's projection)
        self.network.head.requires_grad_(train_head)
        self.classifier = classifier


class ClassificationMethod(Method):
    """Cross-entropy family: a classifier on the backbone features, retrieval on the features."""

    retrieval = "features"

    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        if setup.feature_dim <= 0:
            raise ValueError("a classification method needs the backbone's feature width (MethodSetup.feature_dim)")
        self.classifier = self.new_classifier()

    def new_classifier(self) -> Classifier:
        return Classifier(self.setup.feature_dim, self.setup.num_classes, self.hparams["classifier"],
                          self.hparams["temperature"])

    def trainable(self, epoch: int) -> Trainable:
        return Trainable(frozen=("head",))

    def loss(self, batch: Batch):
        """Plain cross-entropy of the given labels (``cross_entropy``, LabelWave, F-correction's first epochs)."""
        return F.cross_entropy(self.classifier(batch.features), batch.labels), {}

    def param_groups(self, base_lr: float, weight_decay: float) -> list[dict[str, Any]]:
        """Classifiers at ``lr_multiplier`` x lr; a peer network's backbone at the base lr, as the model's."""
        classifiers, networks = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (networks if ".network." in f".{name}" else classifiers).append(p)
        groups = [{"params": classifiers, "lr": base_lr * self.lr_multiplier()}] if classifiers else []
        return groups + ([{"params": networks, "lr": base_lr}] if networks else [])

    @torch.no_grad()
    def predictions(self, features: torch.Tensor, classifier: Classifier | None = None,
                    chunk: int = 4096) -> torch.Tensor:
        """Softmax probabilities of features (an embedding pass's, on the CPU), in chunks."""
        classifier = classifier or self.classifier
        device = next(classifier.parameters()).device
        return torch.cat([F.softmax(classifier(part.to(device)), dim=1).cpu()
                          for part in features.split(chunk)]) if len(features) else torch.empty(0)
