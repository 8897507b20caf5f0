"""The embedded pretraining: a source glyph set disjoint from the target, the backbone it trains, loading it."""

import copy

import numpy as np
import pytest
import torch

from noisydml.data import glyphs
from noisydml.engine.pretrain import pretrain_backbone
from noisydml.models import SmallCNN, adapt_first_layer, check_backbone, load_backbone_weights
from noisydml.tools.check import validate_all
from noisydml.schema import ParamsError


@pytest.fixture(scope="module")
def source_and_target():
    """Slow (about 11 s, once per process): both sets are chosen by rendering every candidate character in every
    face and comparing the pictures; the functions cache their answer for the rest of the process."""
    return glyphs.source_chars(), glyphs.available_chars()


def test_source_characters_are_disjoint_from_every_target_class_by_code_point(source_and_target):
    source, target = source_and_target
    assert len(source) >= 400  # the default pretrain.classes
    assert not set(map(ord, source)) & set(map(ord, target))
    # by block too: no source range overlaps a target range
    for lo, hi in glyphs.SOURCE_CODE_POINT_RANGES:
        for tlo, thi in glyphs.CODE_POINT_RANGES:
            assert hi <= tlo or thi <= lo


def test_source_characters_do_not_look_like_any_target_class(source_and_target):
    source, target = source_and_target
    distances = glyphs.lookalike_distances(source, target)
    assert np.isfinite(distances).all()  # every source character is compared in at least one face
    assert distances.min() >= glyphs.LOOKALIKE_DISTANCE
    # the rule catches the cross-script lookalikes it is meant to: they are not in the source set
    for lookalike in ("\u0585", "\u2126", "\u212a"):  # ARMENIAN SMALL LETTER OH, OHM SIGN, KELVIN SIGN
        assert lookalike not in source
        assert glyphs.lookalike_distances([lookalike], target)[0] < glyphs.LOOKALIKE_DISTANCE


def test_source_set_renders_deterministically():
    a = glyphs.generate_source(5, 6, 16, seed=3)
    b = glyphs.generate_source(5, 6, 16, seed=3)
    assert np.array_equal(a[0], b[0]) and a[2] == b[2] and a[0].shape == (30, 16, 16, 1)
    with pytest.raises(ValueError, match=r"pretrain.classes: 100000, but only \d+ source characters"):
        glyphs.generate_source(100000, 6, 16, seed=0)


def _cfg(**kw):
    return {"epochs": 3, "batch_size": 16, "lr": 0.01, "weight_decay": 0.0, "seed": 0, **kw}


def test_pretraining_learns_the_source_classes_and_is_deterministic():
    images, labels, _ = glyphs.generate_source(6, 14, 16, seed=0)
    train_cfg = {"backbone": "small_cnn", "backbone_width": 4, "pooling": "avg"}
    state, measured = pretrain_backbone(train_cfg, _cfg(epochs=6), images, labels, progress=False)
    again, _ = pretrain_backbone(train_cfg, _cfg(epochs=6), images, labels, progress=False)
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert measured["held_out_images"] == 6 * 4 and measured["train_images"] == 6 * 10
    assert measured["source_accuracy"] > 1 / 6  # above chance on held-out views


def test_grey_weights_on_colour_images_answer_a_grey_image_as_before():
    grey, colour = SmallCNN(1, 4).eval(), SmallCNN(3, 4).eval()
    load_backbone_weights(colour, grey.state_dict(), "test")
    x = torch.rand(2, 1, 16, 16)
    assert torch.allclose(grey(x), colour(x.expand(-1, 3, -1, -1)), atol=1e-5)
    # and back: colour weights on grey images sum the kernel over its channels
    adapted = adapt_first_layer(colour.state_dict(), grey)
    assert adapted["features.0.weight"].shape[1] == 1


def test_weights_of_another_backbone_are_refused():
    with pytest.raises(ValueError, match=r"tensors are missing .* is it a state dict of train.backbone"):
        load_backbone_weights(SmallCNN(1, 4), {"conv1.weight": torch.zeros(1)}, "other.pt")
    with pytest.raises(ValueError, match=r"has shape \(8, 1, 3, 3\), the backbone's is \(4, 1, 3, 3\)"):
        load_backbone_weights(SmallCNN(1, 4), SmallCNN(1, 8).state_dict(), "wider.pt")


@pytest.mark.parametrize("value, message", [
    ("imagenet", r"'imagenet' weights exist for the ResNets only"),
    ("ImageNet", r"train.pretrained: 'ImageNet' is not allowed; did you mean 'imagenet'\?; allowed: none, embedded, imagenet, a name in `weights` "
                  r"\(none defined\), or a path"),
])
def test_bad_pretrained_sources_are_refused(value, message):
    with pytest.raises(ParamsError, match=message):
        check_backbone({"backbone": "small_cnn", "pretrained": value})


def test_the_old_boolean_is_refused_at_load_time(raw_params):
    raw = copy.deepcopy(raw_params)
    raw["train"]["pretrained"] = False
    with pytest.raises(ParamsError, match="train.pretrained"):
        validate_all(raw)
