"""The embedded ``glyphs`` dataset: characters rendered offline with matplotlib's fonts.

One class is one character (Latin letters with their accented variants,
digits, Greek, Cyrillic) that every chosen face covers; one image is that
character in a random face (DejaVu Sans/Serif/Mono and STIX, all styles) with a
random rotation, scale, shift and stroke thickness. Characters that render to
(nearly) the same picture as an earlier one in every face -- Latin ``A``,
Greek ``Alpha`` and Cyrillic ``A`` share outlines -- are dropped, so no two
classes are the same picture under different labels.

Everything is drawn from one seeded generator, so the same parameters give the
same bytes.
"""

from __future__ import annotations

import functools

import unicodedata
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib import ft2font
from PIL import Image, ImageFilter

#: Faces used to draw images: every style of DejaVu Sans, Serif, Mono and STIX General.
FACE_FILES = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
)
#: Faces in which two characters must look alike for the later one to be dropped.
DEDUP_FACES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "STIXGeneral.ttf")
#: Unicode blocks the classes come from: Basic Latin, Latin-1, Latin Extended-A and -B, Greek, Cyrillic.
CODE_POINT_RANGES = ((0x30, 0x7F), (0xC0, 0x250), (0x370, 0x400), (0x400, 0x460))

#: The pretraining source set (``pretrain`` stage): blocks with no letter of the target blocks above --
#: Armenian, Georgian, letterlike symbols, arrows, mathematical operators, miscellaneous technical,
#: geometric shapes. Like ImageNet for CUB: other classes of the same kind of picture.
SOURCE_CODE_POINT_RANGES = ((0x531, 0x58A), (0x10A0, 0x1100), (0x2100, 0x2150), (0x2190, 0x2200), (0x2200, 0x2300),
                            (0x2300, 0x2400), (0x25A0, 0x2600))
#: A source character must be drawn by at least this many faces (the views of a class vary by face).
MIN_SOURCE_FACES = 8
#: Ours: a source character is dropped when, in a face of DEDUP_FACES that draws both, its 32x32 picture is this
#: close to any target character's (:func:`ink_distance`; 0 = the same ink, 1 = no common ink). Distinct target
#: classes have a median nearest distance of 0.17 (10% below 0.04), so 0.25 keeps only sources that differ
#: from every target more than a typical pair of target classes does (Armenian o = Latin o: 0.01; OHM SIGN =
#: Greek Omega: 0.11; both dropped).
LOOKALIKE_DISTANCE = 0.25
LOOKALIKE_SIDE = 32

CANVAS = 64  # glyphs are drawn and transformed at this size, then reduced to image_size
EM_PIXELS = 36  # font size in pixels on the canvas
DEDUP_TOLERANCE = 1.0  # mean absolute pixel difference (0..255) below which two glyphs look alike


def font_dir() -> Path:
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def _candidate_chars() -> list[str]:
    chars = []
    for lo, hi in CODE_POINT_RANGES:
        for cp in range(lo, hi):
            ch = chr(cp)
            cat = unicodedata.category(ch)
            if cat.startswith("L") or cat == "Nd":
                chars.append(ch)
    return chars


def _render(font: ft2font.FT2Font, ch: str) -> np.ndarray:
    """The glyph of ``ch`` centred (by its ink's bounding box) on a CANVAS x CANVAS uint8 array."""
    font.set_text(ch, 0.0)
    font.draw_glyphs_to_bitmap(antialiased=True)
    ink = np.asarray(font.get_image())
    canvas = np.zeros((CANVAS, CANVAS), np.uint8)
    ys, xs = np.nonzero(ink)
    if len(ys) == 0:
        return canvas
    ink = ink[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1][:CANVAS, :CANVAS]
    h, w = ink.shape
    top, left = (CANVAS - h) // 2, (CANVAS - w) // 2
    canvas[top : top + h, left : left + w] = ink
    return canvas


def load_fonts(names: tuple[str, ...]) -> list[ft2font.FT2Font]:
    fonts = []
    for name in names:
        path = font_dir() / name
        if not path.is_file():
            raise FileNotFoundError(f"glyphs: matplotlib font {path} is missing; reinstall matplotlib")
        font = ft2font.FT2Font(str(path))
        font.set_size(EM_PIXELS, 72)  # 72 dpi: points are pixels
        fonts.append(font)
    return fonts


def available_chars() -> list[str]:
    """Characters every face covers, minus those that look like an earlier one in every face."""
    return list(_available_chars())


@functools.cache
def _available_chars() -> tuple[str, ...]:
    """:func:`available_chars`, computed once per process (it renders every candidate in every face: seconds)."""
    fonts = load_fonts(FACE_FILES)
    covered = _candidate_chars()
    for font in fonts:
        charmap = font.get_charmap()
        covered = [c for c in covered if charmap.get(ord(c), 0) != 0]
    dedup_fonts = load_fonts(DEDUP_FACES)
    # (faces, chars, pixels) as float for the pairwise comparison
    renders = np.stack(
        [np.stack([_render(f, c) for c in covered]).reshape(len(covered), -1) for f in dedup_fonts]
    ).astype(np.float32)
    kept: list[int] = []
    for i in range(len(covered)):
        if kept:
            diffs = np.abs(renders[:, kept, :] - renders[:, i : i + 1, :]).mean(axis=2)  # (faces, kept)
            if np.any(diffs.max(axis=0) < DEDUP_TOLERANCE):
                continue
        kept.append(i)
    return tuple(covered[i] for i in kept)


def ink_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise ``sum|a - b| / (sum a + sum b)`` of flattened grey pictures ``a`` (n, d) and ``b`` (m, d)."""
    a = a.astype(np.float32)
    b = b.astype(np.float32)
    out = np.empty((len(a), len(b)), np.float32)
    for i in range(0, len(a), 64):  # blocks of 64 rows: (64, m, d) floats at a time
        block = a[i : i + 64]
        out[i : i + 64] = np.abs(block[:, None, :] - b[None, :, :]).sum(2) / (
            block.sum(1)[:, None] + b.sum(1)[None, :] + 1e-6)
    return out


def _small(font: ft2font.FT2Font, ch: str) -> np.ndarray:
    """``ch`` drawn centred, reduced to LOOKALIKE_SIDE pixels a side, flattened."""
    img = Image.fromarray(_render(font, ch)).resize((LOOKALIKE_SIDE, LOOKALIKE_SIDE), Image.Resampling.BOX)
    return np.asarray(img, np.float32).ravel()


def lookalike_distances(source: list[str], target: list[str]) -> np.ndarray:
    """For each source character, its smallest :func:`ink_distance` to any target character over the faces
    of DEDUP_FACES that draw both (inf where no face draws both)."""
    best = np.full(len(source), np.inf, np.float32)
    for font in load_fonts(DEDUP_FACES):
        charmap = font.get_charmap()
        src = [i for i, c in enumerate(source) if charmap.get(ord(c), 0)]
        tgt = [c for c in target if charmap.get(ord(c), 0)]
        if not src or not tgt:
            continue
        d = ink_distance(np.stack([_small(font, source[i]) for i in src]), np.stack([_small(font, c) for c in tgt]))
        best[src] = np.minimum(best[src], d.min(1))
    return best


def faces_covering(ch: str, fonts: list[ft2font.FT2Font]) -> list[int]:
    return [i for i, f in enumerate(fonts) if f.get_charmap().get(ord(ch), 0)]


def source_chars() -> list[str]:
    """The pretraining characters: from SOURCE_CODE_POINT_RANGES, drawn by at least MIN_SOURCE_FACES faces,
    unlike every target character (:data:`LOOKALIKE_DISTANCE`) and unlike each other (the target's own rule)."""
    return list(_source_chars())


@functools.cache
def _source_chars() -> tuple[str, ...]:
    """:func:`source_chars`, computed once per process (it renders and compares every candidate: seconds)."""
    fonts = load_fonts(FACE_FILES)
    candidates = []
    for lo, hi in SOURCE_CODE_POINT_RANGES:
        for cp in range(lo, hi):
            ch = chr(cp)
            if unicodedata.category(ch)[0] in "CZM":  # no controls, spaces or combining marks
                continue
            if len(faces_covering(ch, fonts)) >= MIN_SOURCE_FACES:
                candidates.append(ch)
    far = lookalike_distances(candidates, available_chars()) >= LOOKALIKE_DISTANCE
    candidates = [c for c, keep in zip(candidates, far) if keep]
    # among themselves: drop one that draws (nearly) the same as an earlier one in every dedup face drawing both
    dedup = load_fonts(DEDUP_FACES)
    kept: list[str] = []
    pictures: list[list[np.ndarray | None]] = []
    for ch in candidates:
        own = [_render(f, ch).astype(np.float32) if f.get_charmap().get(ord(ch), 0) else None for f in dedup]
        same = False
        for other in pictures:
            diffs = [np.abs(a - b).mean() for a, b in zip(own, other) if a is not None and b is not None]
            if diffs and max(diffs) < DEDUP_TOLERANCE:
                same = True
                break
        if not same:
            kept.append(ch)
            pictures.append(own)
    return tuple(kept)


def generate_source(num_classes: int, images_per_class: int, image_size: int, seed: int, progress=None):
    """Render the pretraining set: like :func:`generate`, over :func:`source_chars`, each view drawn by one of
    the faces that cover its character. Returns ``(images, labels, class_names)``."""
    chars = source_chars()
    if num_classes > len(chars):
        raise ValueError(f"pretrain.classes: {num_classes}, but only {len(chars)} source characters are available; "
                         f"allowed: 2..{len(chars)}")
    return _render_classes(chars, num_classes, images_per_class, image_size, seed, progress)


def class_name(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, '?')}"


def _augment(template: np.ndarray, rng: np.random.Generator, image_size: int) -> np.ndarray:
    """One random view of a glyph: stroke thickness, rotation, scale, shift, then downsampling."""
    img = Image.fromarray(template)
    stroke = rng.integers(0, 3)  # 0 thinner, 1 as drawn, 2 thicker (wider filters erase or blob glyphs)
    if stroke == 0:
        thinner = img.filter(ImageFilter.MinFilter(3))
        # Hairline faces (STIX italics) vanish when eroded: keep those as drawn.
        if np.asarray(thinner).max() >= 128:
            img = thinner
    elif stroke == 2:
        img = img.filter(ImageFilter.MaxFilter(3))
    angle = np.deg2rad(rng.uniform(-15, 15))
    scale = rng.uniform(0.75, 1.15)
    shift = rng.uniform(-5, 5, size=2)
    # PIL's affine maps output pixels to input pixels: the inverse of rotate+scale about the centre.
    c = CANVAS / 2
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    tx, ty = c + shift[0], c + shift[1]
    a, b = cos, sin
    d, e = -sin, cos
    coeffs = (a, b, c - a * tx - b * ty, d, e, c - d * tx - e * ty)
    img = img.transform((CANVAS, CANVAS), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    if image_size != CANVAS:
        img = img.resize((image_size, image_size), Image.Resampling.BOX)
    out = np.asarray(img, dtype=np.float32)
    # Stretch to full contrast: thin strokes averaged down by the resize stay visible.
    peak = out.max()
    if peak > 0:
        out *= 255.0 / peak
    return np.round(out).astype(np.uint8)


def generate(num_classes: int, images_per_class: int, image_size: int, seed: int, progress=None):
    """Render the dataset.

    Returns ``(images, labels, class_names)``: images ``(N, image_size, image_size, 1)`` uint8,
    labels ``(N,)`` int64 in ``0..num_classes-1`` ordered by class, and one name per class.
    Classes are a seeded random choice of the available characters, in a seeded random order.
    """
    chars = available_chars()
    if num_classes > len(chars):
        raise ValueError(
            f"glyphs: num_classes={num_classes}, but only {len(chars)} distinct characters are "
            f"available in every face; allowed: 4..{len(chars)}"
        )
    return _render_classes(chars, num_classes, images_per_class, image_size, seed, progress)


def _render_classes(chars: list[str], num_classes: int, images_per_class: int, image_size: int, seed: int,
                    progress=None):
    """A seeded choice of ``num_classes`` of ``chars``, ``images_per_class`` random views of each, every view
    drawn by one of the faces that cover its character (every face, for the target's characters)."""
    rng = np.random.default_rng(seed)
    chosen = [chars[i] for i in rng.permutation(len(chars))[:num_classes]]
    fonts = load_fonts(FACE_FILES)
    images = np.empty((num_classes * images_per_class, image_size, image_size, 1), np.uint8)
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), images_per_class)
    for label, ch in enumerate(chosen):
        covering = faces_covering(ch, fonts)
        templates = [_render(fonts[i], ch) for i in covering]
        faces = rng.integers(0, len(covering), size=images_per_class)
        for j, face in enumerate(faces):
            images[label * images_per_class + j, :, :, 0] = _augment(templates[face], rng, image_size)
        if progress is not None:
            progress.update(1)
    return images, labels, [class_name(c) for c in chosen]
