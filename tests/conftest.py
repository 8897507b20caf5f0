import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def raw_params():
    """The repository's params.yaml as a plain mapping, to modify in a test.

    Runs start from scratch here (``train.pretrained: none``): a unit test has no pretrain stage's output;
    tests/test_pretrain.py and the end-to-end test cover the pretrained start. No figure stages (the
    end-to-end test has one)."""
    with open(REPO / "params.yaml") as f:
        raw = copy.deepcopy(yaml.safe_load(f))
    raw["train"]["pretrained"] = "none"
    raw["figures"]["bspml_maps"] = {}  # tests shrink the grid; a map needs its bspml run in it
    return raw


def tiny_params(raw):
    """Shrink params to a few glyph classes and one short epoch."""
    raw["datasets"]["glyphs"].update(num_classes=12, images_per_class=6, image_size=16)
    raw["train"].update(epochs=1, batch={"classes": 4, "per_class": 2}, eval_every=1, backbone_width=4, embedding_dim=8)
    raw["methods"]["mcl"]["memory_size"] = 64
    return raw


def batch_of(embeddings, labels, step=0, index=None, epoch=0, features=None):
    """A :class:`~noisydml.methods.base.Batch` for calling ``Method.loss`` directly in tests."""
    import torch

    from noisydml.methods.base import Batch

    index = torch.arange(len(labels)) if index is None else index
    features = embeddings.detach() if features is None else features
    return Batch(embeddings=embeddings, features=features, labels=labels, index=index, sample_id=index,
                 step=step, epoch=epoch)
