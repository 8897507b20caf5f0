"""The embedded motifs dataset: RGB, fine-grained, deterministic, with a disjoint pretraining source set."""

import copy
import hashlib

import numpy as np
import pytest

from conftest import tiny_params
from noisydml.config import validate_params
from noisydml.sections.pretrain import PRETRAIN_SOURCE_CLASSES
from noisydml.data import motifs
from noisydml.data.registry import DATASET_KINDS
from noisydml.schema import ParamsError

#: sha256 prefix of motifs.generate(8, 2, 16, seed=0)'s images, computed at the commit before the generator's knobs
MOTIFS_8x2x16_SEED0 = "7b054c217355ca0a"


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
    most = motifs.max_classes(species_per_genus=motifs.MAX_SPECIES_PER_GENUS)
    assert most == DATASET_KINDS["motifs"].schema["num_classes"].max
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


def test_the_default_knobs_are_the_motifs_dataset_byte_for_byte():
    """species_per_genus, hue_jitter and whole_genera at their defaults draw and render what motifs always did:
    the digest of its first images, recorded before the knobs existed."""
    images = motifs.generate(8, 2, 16, seed=0, species_per_genus=4, hue_jitter=0.02, whole_genera=False)[0]
    assert np.array_equal(images, motifs.generate(8, 2, 16, seed=0)[0])
    assert hashlib.sha256(images.tobytes()).hexdigest()[:16] == MOTIFS_8x2x16_SEED0


def test_whole_genera_put_siblings_in_both_halves_and_hue_jitter_turns_every_image():
    """motifs_hard's draw: every species of num_classes / species_per_genus genera, so a test species meets its
    siblings; past 4 species per genus siblings share a pattern; hue_jitter changes the rendered images."""
    names = motifs.generate(32, 1, 16, seed=0, species_per_genus=8, whole_genera=True)[2]
    genera_of = [name.split(" / ")[0] for name in names]
    assert len(set(genera_of)) == 4 and all(genera_of.count(g) == 8 for g in set(genera_of))
    train, test = set(genera_of[:16]), set(genera_of[16:])
    assert train == test  # siblings on both sides of the class-disjoint split
    species = motifs.species_of(motifs.target_genera()[0], 0, per_genus=8)
    assert len(species) == 8 and len({s.pattern for s in species}) == 3
    calm = motifs.generate(2, 6, 32, seed=1, hue_jitter=0.0)[0]
    turned = motifs.generate(2, 6, 32, seed=1, hue_jitter=0.3)[0]
    assert not np.array_equal(calm, turned)
    with pytest.raises(ValueError, match="num_classes=600, but 576 species"):
        motifs.generate(600, 1, 16, seed=0)


def test_motifs_num_classes_is_checked_against_its_species_per_genus(raw_params):
    body = {**{k: v for k, v in raw_params["datasets"]["motifs"].items() if k != "kind"}, "num_classes": 700,
            "species_per_genus": 4}
    with pytest.raises(ParamsError, match=r"datasets.motifs.num_classes: 700, but 576 species exist at "
                                          r"species_per_genus 4; allowed: 4..576"):
        DATASET_KINDS["motifs"].check(body, "datasets.motifs")
    assert DATASET_KINDS["motifs"].check({**body, "species_per_genus": 8}, "datasets.motifs")["num_classes"] == 700


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
