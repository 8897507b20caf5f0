"""The embedded motifs dataset: RGB, fine-grained, deterministic, with a disjoint pretraining source set."""

import copy

import numpy as np
import pytest

from conftest import tiny_params
from noisydml.config import PRETRAIN_SOURCE_CLASSES, validate_params
from noisydml.data import motifs
from noisydml.data.registry import DATASET_KINDS
from noisydml.schema import ParamsError


def test_same_parameters_give_the_same_bytes_and_rgb_images():
    a = motifs.generate(6, 4, 32, seed=3)
    b = motifs.generate(6, 4, 32, seed=3)
    c = motifs.generate(6, 4, 32, seed=4)
    assert a[0].shape == (24, 32, 32, 3) and a[0].dtype == np.uint8
    assert np.array_equal(a[0], b[0]) and a[2] == b[2]
    assert not np.array_equal(a[0], c[0])
    assert list(a[1]) == [k for k in range(6) for _ in range(4)]
    # colour: the channels differ (not grey), and the images of one class differ (pose, colour, background)
    assert np.abs(a[0][..., 0].astype(int) - a[0][..., 1]).mean() > 5
    assert all(len({img.tobytes() for img in a[0][a[1] == k]}) == 4 for k in range(6))


def test_the_source_set_shares_no_genus_with_the_dataset_and_the_bounds_are_the_counts():
    target, source = motifs.target_genera(), motifs.source_genera()
    assert not set(target) & set(source)
    assert len(set(target)) == len(target) and len(set(source)) == len(source)
    assert motifs.max_classes() == DATASET_KINDS["motifs"].schema["num_classes"].max
    assert motifs.max_classes(source=True) == PRETRAIN_SOURCE_CLASSES["motifs"]
    source_names = {name.split(" / ")[0] for name in motifs.generate_source(40, 2, 16, seed=0)[2]}
    target_names = {name.split(" / ")[0] for name in motifs.generate(40, 2, 16, seed=0)[2]}
    assert not source_names & target_names


def test_species_of_a_genus_share_the_shape_and_differ_in_colour_or_pattern():
    genus = motifs.target_genera()[0]
    species = motifs.species_of(genus, 0)
    assert len(species) == motifs.SPECIES_PER_GENUS and {s.genus for s in species} == {genus}
    hues = sorted(s.hue for s in species)
    gaps = np.diff(hues + [hues[0] + 1.0])
    assert gaps.min() > 0.15  # far above the per-image hue jitter (0.02)
    assert motifs.species_of(genus, 0) == species  # seeded


def test_motifs_trains_through_the_pipeline_with_small_cluster_noise(raw_params, tmp_path):
    from noisydml.pipeline.corrupt import corrupt
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.prepare import prepare
    from noisydml.pipeline.train import train
    from noisydml.runs import GRID, Run

    raw = tiny_params(raw_params)
    raw["datasets"]["motifs"].update(num_classes=20, images_per_class=6, image_size=16)
    raw["grid"].update(datasets=["motifs"], noises=["sym50", "sc50"], methods=["ms"], seeds=[0])
    raw["chains"] = {}
    raw["figures"]["bspml_maps"] = {}
    raw["timing"]["dataset"] = "motifs"
    for section in raw["figures"].values():
        if isinstance(section, dict) and section.get("dataset") == "glyphs":
            section["dataset"] = "motifs"
    raw["noise"]["sc50"]["features"].update(pca_dim=8, pixel_side=16)
    params = validate_params(raw)
    layout = Layout(tmp_path)
    info = prepare(params, "motifs", layout)
    assert info["num_classes"] == 20
    stats = corrupt(params, "motifs", "sc50", layout)
    assert stats["actual_rate"] > 0
    out = train(params, Run(GRID, "motifs-sc50-ms-0", "motifs", "sc50", "ms", 0, "ms"), layout)
    assert (out / "model.pt").is_file()


def test_pretrain_source_is_validated_with_its_own_bound(raw_params):
    raw = copy.deepcopy(raw_params)
    raw["pretrain"].update(source="motifs", classes=576)
    assert validate_params(raw)["pretrain"]["source"] == "motifs"
    raw["pretrain"].update(source="glyphs")
    with pytest.raises(ParamsError, match="pretrain.classes: 576 is above the maximum 567"):
        validate_params(raw)
    raw["pretrain"].update(source="cifar")
    with pytest.raises(ParamsError, match="pretrain.source"):
        validate_params(raw)
