"""Pretraining a backbone on the embedded source glyphs: ImageNet pretraining in miniature.

Every paper this project reproduces fine-tunes an ImageNet-pretrained backbone on
the noisy training classes. The embedded profile does the same at CPU scale: the
backbone first learns to classify *other* characters (:func:`noisydml.data.glyphs.source_chars`:
other scripts and symbols, disjoint from every target class by code point and by
picture) with clean labels, then every method of the grid starts from those
weights (``train.pretrained: embedded``).

The objective is ours (the issue allows normalised softmax or cross-entropy):
cross-entropy over the source classes through a linear classifier on the
backbone's pooled features, Adam with a cosine schedule. The classifier is
thrown away; only the backbone's weights are kept. A held-out share of every
source class's images gives the source accuracy reported in the card.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from noisydml.data.images import images_to_tensor
from noisydml.engine.eager_optim import eager
from noisydml.models import BACKBONES

#: Images of each source class kept out of pretraining to measure source accuracy (ours).
HELD_OUT_PER_CLASS = 4


def pretrain_backbone(train_cfg: dict, cfg: dict, images: np.ndarray, labels: np.ndarray,
                      progress: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Train ``train_cfg``'s backbone to classify ``labels``; return its state dict and what it measured.

    ``cfg`` is params.yaml's ``pretrain`` section (epochs, batch_size, lr, weight_decay, seed). The last
    HELD_OUT_PER_CLASS images of every class are held out (the source accuracy)."""
    torch.manual_seed(cfg["seed"])
    rng = np.random.default_rng(cfg["seed"])
    labels = np.asarray(labels, np.int64)
    num_classes = int(labels.max()) + 1
    position_in_class = np.arange(len(labels)) - np.searchsorted(labels, labels)
    per_class = np.bincount(labels)
    held_out = position_in_class >= (per_class[labels] - HELD_OUT_PER_CLASS)
    # the trainer's image scaling, so the weights see what fine-tuning will feed them
    x_train, y_train = images_to_tensor(images[~held_out]), torch.from_numpy(labels[~held_out])
    x_test, y_test = images_to_tensor(images[held_out]), torch.from_numpy(labels[held_out])

    backbone = BACKBONES[train_cfg["backbone"]](images.shape[-1], train_cfg)
    classifier = nn.Linear(backbone.out_dim, num_classes)
    model = nn.Sequential(backbone, classifier)
    optimizer = eager(torch.optim.Adam)(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    steps_per_epoch = max(1, len(x_train) // cfg["batch_size"])
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg["epochs"] * steps_per_epoch)
    history = []
    t0 = time.perf_counter()
    for epoch in range(cfg["epochs"]):
        model.train()
        order = torch.from_numpy(rng.permutation(len(x_train)))
        loss_sum = 0.0
        bar = tqdm(range(steps_per_epoch), desc=f"pretrain epoch {epoch + 1}/{cfg['epochs']}", unit="step",
                   disable=not progress, leave=False, mininterval=1.0)
        for i in bar:
            idx = order[i * cfg["batch_size"] : (i + 1) * cfg["batch_size"]]
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += loss.item()
        accuracy = _accuracy(model, x_test, y_test)
        history.append({"epoch": epoch + 1, "loss": loss_sum / steps_per_epoch, "source_accuracy": accuracy})
        print(f"pretrain epoch {epoch + 1}: loss={loss_sum / steps_per_epoch:.4f} "
              f"held-out source accuracy={accuracy:.4f}")
    measured = {
        "source_classes": num_classes,
        "train_images": int(len(x_train)),
        "held_out_images": int(len(x_test)),
        "source_accuracy": history[-1]["source_accuracy"],
        "history": history,
    }
    # seconds are printed, not returned: the card is a DVC output and must not change between identical runs
    print(f"pretrained in {time.perf_counter() - t0:.1f}s: held-out source accuracy {history[-1]['source_accuracy']:.4f}")
    return backbone.state_dict(), measured


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(x), 512):
        correct += int((model(x[i : i + 512]).argmax(1) == y[i : i + 512]).sum())
    return correct / max(1, len(x))
