"""The embedded ``motifs`` dataset: fine-grained, RGB, generated offline -- CUB or Cars in miniature, unlike glyphs.

A class is a **species** of a **genus**. A genus fixes the shape: the body (an ellipse, a polygon of 3-6 sides or
a star of 4-6 points), its aspect ratio, and 1-3 parts (circles or triangles) at fixed angles around it. The
species of one genus share that shape and differ only in their colours (body hue, part hue) and the pattern on
the body (stripes of a frequency and orientation, spots, or none): telling them apart is the fine-grained task,
as birds of one family differ by their markings. Every image of a species varies in

- pose: rotation (+-60 degrees), scale, shift and a mirror flip;
- colour: hue, saturation and brightness jitter (smaller than the hue gaps between the species of a genus);
- pattern phase (where the stripes fall), and
- background: a gradient between two random colours with random low-contrast blobs (clutter).

Genera are enumerated (:func:`genera`), shuffled by a fixed seed and split in two halves: the dataset's classes
come from the first half, the pretraining source set (:func:`generate_source`, ``pretrain.source: motifs``) from
the second, so no source class shares a genus -- a shape -- with a dataset class. Everything is drawn from seeded
generators: the same parameters give the same bytes.

Three knobs of :func:`generate` (ours; params.yaml's ``datasets.<name>``) set the difficulty; their defaults are
the ``motifs`` dataset, on which the source-pretrained backbone already separates the test species (its
untrained head scores about 96 P@1, so label noise has little to hurt). ``species_per_genus`` (siblings
``1 / k`` of the hue circle apart, patterns shared past 4), ``whole_genera`` (every species of
``num_classes / k`` shapes, so a test species meets its siblings) and ``hue_jitter`` (every image's hues turned:
past ~0.25 colour is a nuisance, not a cue). ``motifs_hard`` is 8 species per genus, whole genera, trained from
the glyph-pretrained backbone, whose features do not separate the species: what does is learnt from the labels.
"""

from __future__ import annotations

import colorsys
import itertools
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

CANVAS = 64  # drawn and transformed at this size, then reduced to image_size
BODY_RADIUS = 17.0  # pixels on the canvas
PART_RADIUS = 6.0
SPECIES_PER_GENUS = 4
MAX_SPECIES_PER_GENUS = 12  # ours: hues 1/12 of the circle apart, about the +-0.04 each species' hue is moved
#: Ours: the genus enumeration's shuffle, fixed so that the dataset / source split never moves with a seed.
SPLIT_SEED = 20261125
#: Ours: per-image jitter. The species of a genus are 1/4 of the hue circle apart (+-0.04), the jitter far below.
HUE_JITTER, SATURATION_JITTER, VALUE_JITTER = 0.02, (0.8, 1.1), (0.75, 1.15)
ROTATION_DEGREES, SCALE, SHIFT = 60.0, (0.75, 1.05), 6.0


@dataclass(frozen=True)
class Genus:
    body: str  # ellipse | polygon | star
    sides: int  # polygon sides / star points (0 for an ellipse)
    aspect: float  # body height / width
    parts: tuple[float, ...]  # angles (radians) of the parts around the body
    part_shape: str  # circle | triangle

    @property
    def name(self) -> str:
        body = self.body if not self.sides else f"{self.body}{self.sides}"
        angles = ",".join(str(round(np.degrees(a)) % 360) for a in self.parts)
        return f"{body} a{self.aspect:g} {self.part_shape}s at {angles}"


@dataclass(frozen=True)
class Species:
    genus: Genus
    number: int
    hue: float
    part_hue: float
    pattern: str  # stripes | spots | plain
    frequency: float  # stripes across the body
    orientation: float  # radians
    spots: tuple[tuple[float, float], ...]  # spot centres on the unit body

    @property
    def name(self) -> str:
        return f"{self.genus.name} / species {self.number}"


#: Ours: where the parts sit (radians, 0 = right of the body), per layout.
PART_LAYOUTS = {1: ((np.pi,), (np.pi / 2,), (-np.pi / 3,)),
                2: ((0.0, np.pi), (np.pi / 2, -np.pi / 2), (3 * np.pi / 4, -3 * np.pi / 4)),
                3: ((0.0, 2 * np.pi / 3, -2 * np.pi / 3), (np.pi, np.pi / 3, -np.pi / 3),
                    (np.pi / 2, np.pi, -np.pi / 2))}


def genera() -> list[Genus]:
    """Every genus: bodies x aspects x part layouts x part shapes (288), in a fixed shuffled order."""
    bodies = [("ellipse", 0)] + [("polygon", n) for n in (3, 4, 5, 6)] + [("star", n) for n in (4, 5, 6)]
    out = [Genus(body, sides, aspect, layout, shape)
           for (body, sides), aspect, count, shape in itertools.product(bodies, (0.55, 0.85), (1, 2, 3),
                                                                        ("circle", "triangle"))
           for layout in PART_LAYOUTS[count]]
    order = np.random.default_rng(SPLIT_SEED).permutation(len(out))
    return [out[i] for i in order]


def target_genera() -> list[Genus]:
    """The dataset's genera: the first half of :func:`genera`."""
    every = genera()
    return every[: len(every) // 2]


def source_genera() -> list[Genus]:
    """The pretraining source set's genera: the second half, disjoint from the dataset's."""
    every = genera()
    return every[len(every) // 2:]


def max_classes(source: bool = False, species_per_genus: int = SPECIES_PER_GENUS) -> int:
    return len(source_genera() if source else target_genera()) * species_per_genus


def species_of(genus: Genus, index: int, per_genus: int = SPECIES_PER_GENUS) -> list[Species]:
    """The species of a genus: hues ``1 / per_genus`` of the circle apart from a genus-specific start (+-0.04),
    each its own part hue and pattern (seeded by the genus's index). The patterns cycle stripes, spots, plain,
    stripes, so more species per genus means more species sharing a pattern: told apart by hue alone."""
    rng = np.random.default_rng([SPLIT_SEED, index])
    start = rng.uniform()
    patterns = rng.permutation((["stripes", "spots", "plain", "stripes"] * per_genus)[:per_genus])
    out = []
    for k in range(per_genus):
        hue = (start + k / per_genus + rng.uniform(-0.04, 0.04)) % 1.0
        spots = tuple((float(x), float(y)) for x, y in rng.uniform(-0.6, 0.6, size=(int(rng.integers(3, 6)), 2)))
        out.append(Species(genus, k, hue, (hue + rng.uniform(0.25, 0.75)) % 1.0, str(patterns[k]),
                           float(rng.choice([2.5, 4.0])), float(rng.uniform(0, np.pi)), spots))
    return out


def _rgb(hue: float, saturation: float, value: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(hue % 1.0, min(max(saturation, 0.0), 1.0), min(max(value, 0.0), 1.0))
    return int(round(255 * r)), int(round(255 * g)), int(round(255 * b))


def _body_points(genus: Genus) -> list[tuple[float, float]]:
    c, rx, ry = CANVAS / 2, BODY_RADIUS, BODY_RADIUS * genus.aspect
    if genus.body == "polygon":
        angles = np.pi / 2 + 2 * np.pi * np.arange(genus.sides) / genus.sides
        return [(c + rx * np.cos(a), c - ry * np.sin(a)) for a in angles]
    angles = np.pi / 2 + np.pi * np.arange(2 * genus.sides) / genus.sides  # star: outer and inner points
    radii = np.where(np.arange(2 * genus.sides) % 2 == 0, 1.0, 0.5)
    return [(c + r * rx * np.cos(a), c - r * ry * np.sin(a)) for a, r in zip(angles, radii)]


def _object(species: Species, rng: np.random.Generator, hue_jitter: float = HUE_JITTER) -> Image.Image:
    """The species at the canonical pose on a transparent canvas, with this image's colour jitter (hue: normal,
    standard deviation ``hue_jitter``) and pattern phase."""
    genus = species.genus
    jitter = rng.normal(0.0, hue_jitter)
    saturation, value = rng.uniform(*SATURATION_JITTER), rng.uniform(*VALUE_JITTER)
    body_colour = _rgb(species.hue + jitter, 0.75 * saturation, 0.85 * value)
    part_colour = _rgb(species.part_hue + jitter, 0.8 * saturation, 0.7 * value)
    mark_colour = _rgb(species.hue + jitter, 0.9 * saturation, 0.45 * value)
    c, rx, ry = CANVAS / 2, BODY_RADIUS, BODY_RADIUS * genus.aspect

    mask = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(mask)
    if genus.body == "ellipse":
        draw.ellipse([c - rx, c - ry, c + rx, c + ry], fill=255)
    else:
        draw.polygon(_body_points(genus), fill=255)
    body = Image.new("RGBA", (CANVAS, CANVAS), body_colour + (255,))
    # the pattern, in the body's own frame (it turns with the pose)
    y, x = (np.mgrid[0:CANVAS, 0:CANVAS] - c) / BODY_RADIUS
    if species.pattern == "stripes":
        along = x * np.cos(species.orientation) + y * np.sin(species.orientation)
        marked = np.sin(np.pi * species.frequency * along + rng.uniform(0, 2 * np.pi)) > 0.3
    elif species.pattern == "spots":
        marked = np.zeros((CANVAS, CANVAS), bool)
        for sx, sy in species.spots:
            marked |= (x - sx * rx / BODY_RADIUS) ** 2 + (y - sy * ry / BODY_RADIUS) ** 2 < 0.06
    else:
        marked = np.zeros((CANVAS, CANVAS), bool)
    pixels = np.array(body)
    pixels[marked, :3] = mark_colour
    body = Image.fromarray(pixels)

    out = Image.new("RGBA", (CANVAS, CANVAS), (0, 0, 0, 0))
    parts = ImageDraw.Draw(out)
    for angle in genus.parts:
        px, py = c + 1.05 * rx * np.cos(angle), c - 1.05 * ry * np.sin(angle)
        if genus.part_shape == "circle":
            parts.ellipse([px - PART_RADIUS, py - PART_RADIUS, px + PART_RADIUS, py + PART_RADIUS],
                          fill=part_colour + (255,))
        else:  # a triangle pointing away from the body
            tip = (px + 1.6 * PART_RADIUS * np.cos(angle), py - 1.6 * PART_RADIUS * np.sin(angle))
            side = angle + np.pi / 2
            base = [(px + PART_RADIUS * np.cos(side), py - PART_RADIUS * np.sin(side)),
                    (px - PART_RADIUS * np.cos(side), py + PART_RADIUS * np.sin(side))]
            parts.polygon([tip, *base], fill=part_colour + (255,))
    out.paste(body, (0, 0), mask)
    return out


def _background(rng: np.random.Generator) -> Image.Image:
    """A gradient between two random colours at a random angle, with 2-5 low-contrast blobs (clutter)."""
    a = np.array(_rgb(rng.uniform(), rng.uniform(0.1, 0.5), rng.uniform(0.3, 0.9)), np.float32)
    b = np.array(_rgb(rng.uniform(), rng.uniform(0.1, 0.5), rng.uniform(0.3, 0.9)), np.float32)
    theta = rng.uniform(0, 2 * np.pi)
    y, x = np.mgrid[0:CANVAS, 0:CANVAS] / (CANVAS - 1)
    t = np.clip(0.5 + (x - 0.5) * np.cos(theta) + (y - 0.5) * np.sin(theta), 0, 1)[..., None]
    image = Image.fromarray(np.round(a * (1 - t) + b * t).astype(np.uint8), "RGB")
    clutter = ImageDraw.Draw(image, "RGBA")
    for _ in range(int(rng.integers(2, 6))):
        cx, cy = rng.uniform(0, CANVAS, size=2)
        w, h = rng.uniform(4, 16, size=2)
        clutter.ellipse([cx - w, cy - h, cx + w, cy + h], fill=_rgb(rng.uniform(), 0.4, rng.uniform(0.3, 0.9)) + (70,))
    return image


def render(species: Species, rng: np.random.Generator, image_size: int, hue_jitter: float = HUE_JITTER) -> np.ndarray:
    """One image of ``species``: its object in a random pose over a random background, ``(S, S, 3)`` uint8."""
    obj = _object(species, rng, hue_jitter)
    angle = np.deg2rad(rng.uniform(-ROTATION_DEGREES, ROTATION_DEGREES))
    scale = rng.uniform(*SCALE)
    shift = rng.uniform(-SHIFT, SHIFT, size=2)
    if rng.uniform() < 0.5:
        obj = obj.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    # PIL's affine maps output pixels to input pixels: the inverse of rotate + scale about the centre, then shift
    c = CANVAS / 2
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    tx, ty = c + shift[0], c + shift[1]
    coeffs = (cos, sin, c - cos * tx - sin * ty, -sin, cos, c + sin * tx - cos * ty)
    obj = obj.transform((CANVAS, CANVAS), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    image = _background(rng)
    image.paste(obj, (0, 0), obj)
    if image_size != CANVAS:
        image = image.resize((image_size, image_size), Image.Resampling.BOX)
    return np.asarray(image, dtype=np.uint8)


def _generate(pool: list[Genus], num_classes: int, images_per_class: int, image_size: int, seed: int,
              progress=None, species_per_genus: int = SPECIES_PER_GENUS, hue_jitter: float = HUE_JITTER,
              whole_genera: bool = False):
    every = [s for i, genus in enumerate(pool) for s in species_of(genus, i, species_per_genus)]
    rng = np.random.default_rng(seed)
    if whole_genera:  # every species of num_classes / species_per_genus genera, then shuffled
        genera_drawn = rng.permutation(len(pool))[: -(-num_classes // species_per_genus)]
        every = [every[g * species_per_genus + k] for g in genera_drawn for k in range(species_per_genus)]
    chosen = [every[i] for i in rng.permutation(len(every))[:num_classes]]
    images = np.empty((num_classes * images_per_class, image_size, image_size, 3), np.uint8)
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), images_per_class)
    for label, species in enumerate(chosen):
        for j in range(images_per_class):
            images[label * images_per_class + j] = render(species, rng, image_size, hue_jitter)
        if progress is not None:
            progress.update(1)
    return images, labels, [s.name for s in chosen]


def generate(num_classes: int, images_per_class: int, image_size: int, seed: int, progress=None,
             species_per_genus: int = SPECIES_PER_GENUS, hue_jitter: float = HUE_JITTER, whole_genera: bool = False):
    """The dataset: ``num_classes`` species drawn (seeded) from the dataset's genera, in a seeded order;
    ``species_per_genus`` species per genus, their images' hues jittered by ``hue_jitter``, whole genera drawn
    or species one by one (``whole_genera``); the defaults are the ``motifs`` dataset.

    Returns ``(images, labels, class_names)``: images ``(N, image_size, image_size, 3)`` uint8, labels ``(N,)``
    in ``0..num_classes-1`` ordered by class. The species of one genus fall on both sides of the train / test
    split (the first half of the classes trains), as CUB's families do."""
    available = max_classes(species_per_genus=species_per_genus)
    if num_classes > available:
        raise ValueError(f"motifs: num_classes={num_classes}, but {available} species are available at "
                         f"{species_per_genus} per genus; allowed: 4..{available}")
    return _generate(target_genera(), num_classes, images_per_class, image_size, seed, progress, species_per_genus,
                     hue_jitter, whole_genera)


def generate_source(num_classes: int, images_per_class: int, image_size: int, seed: int, progress=None):
    """The pretraining source set: like :func:`generate`, over the source genera (no shape in common)."""
    if num_classes > max_classes(source=True):
        raise ValueError(f"pretrain.classes: {num_classes}, but the motifs source set has "
                         f"{max_classes(source=True)} species; allowed: 2..{max_classes(source=True)}")
    return _generate(source_genera(), num_classes, images_per_class, image_size, seed, progress)
